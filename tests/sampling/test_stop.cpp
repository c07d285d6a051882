// StopMatcher: stop strings found across every way of cutting the stream into chunks.
#include <gtest/gtest.h>

#include "sampling/stop.h"

using namespace dsa;

namespace {

// Feeds `text` cut at the given chunk size; returns what was emitted (flushing at the end).
std::string run(const std::vector<std::string>& stops, const std::string& text, size_t chunk, bool* stopped = nullptr) {
  StopMatcher m(stops);
  std::string out;
  for (size_t i = 0; i < text.size() && !m.stopped(); i += chunk) m.push(std::string_view(text).substr(i, chunk), out);
  if (stopped) *stopped = m.stopped();
  m.flush(out);
  return out;
}

// The expected output from the definition: text before the earliest occurrence of any stop.
std::string expected(const std::vector<std::string>& stops, const std::string& text) {
  size_t best = std::string::npos;
  for (const auto& s : stops) best = std::min(best, text.find(s));
  return best == std::string::npos ? text : text.substr(0, best);
}

TEST(StopMatcher, EveryChunkingGivesTheSameResult) {
  const std::vector<std::vector<std::string>> stop_sets = {{"STOP"}, {"\n\n", "User:"}, {"aab"}, {"abc", "bcd"}};
  const std::vector<std::string> texts = {"hello world STOP and more", "no stop here", "line\nUse\n\nUser: x",
                                          "aaaab tail", "aaaaa", "xbcdabc", "ST", "STOPSTOP", ""};
  for (const auto& stops : stop_sets)
    for (const auto& t : texts)
      for (size_t chunk = 1; chunk <= t.size() + 1; ++chunk) {
        bool stopped = false;
        const std::string got = run(stops, t, chunk, &stopped);
        EXPECT_EQ(got, expected(stops, t)) << "'" << t << "' chunk " << chunk;
        EXPECT_EQ(stopped, got.size() != t.size()) << "'" << t << "' chunk " << chunk;
      }
}

TEST(StopMatcher, HoldsBackOnlyAPossiblePrefix) {
  StopMatcher m({"</end>"});
  std::string out;
  m.push("abc</e", out);
  EXPECT_EQ(out, "abc");  // "</e" may become the stop string
  m.push("x", out);
  EXPECT_EQ(out, "abc</ex");  // it did not
  m.push("</en", out);
  m.push("d> tail", out);
  EXPECT_EQ(out, "abc</ex");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "</end>");
  m.push("more", out);  // ignored after stopping
  EXPECT_EQ(out, "abc</ex");
}

TEST(StopMatcher, NoStopsPassesThrough) {
  StopMatcher m;
  std::string out;
  m.push("a", out);
  m.push("b", out);
  EXPECT_EQ(out, "ab");
  EXPECT_FALSE(m.stopped());
  EXPECT_THROW(StopMatcher({""}), std::exception);
}

TEST(StopMatcher, MultibyteStopAcrossChunks) {
  const std::string text = "caf\xc3\xa9 \xe2\x80\x94 end";  // "café — end"
  for (size_t chunk = 1; chunk <= text.size(); ++chunk)
    EXPECT_EQ(run({"\xe2\x80\x94"}, text, chunk), "caf\xc3\xa9 ") << chunk;
}

}  // namespace
