#include "runtime/dist.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>
#include <string>
#include <vector>
#include <thread>

#include "core/error.h"

#ifdef DSA_HAVE_MPI
#include <mpi.h>
#endif

namespace dsa::dist {
namespace {

int g_rank = 0, g_size = 1, g_stage_size = 1;
bool g_active = false;
#ifdef DSA_HAVE_MPI
// The collective this rank waits in (none: since == 0), watched by a thread that ends the
// job when the wait passes the limit: a rank that hangs alive (stopped, deadlocked, its link
// lost) would otherwise hold every other rank in the collective forever.
std::atomic<int64_t> g_wait_since{0};
std::atomic<const char*> g_wait_what{""};
std::atomic<bool> g_watch_stop{false};
double g_timeout_s = 600;

int64_t now_ns() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

struct Waiting {
  explicit Waiting(const char* what) {
    g_wait_what = what;
    g_wait_since = now_ns();
  }
  ~Waiting() { g_wait_since = 0; }
};

// DSA_COMM_TIMEOUT: seconds a collective may wait (0: forever; default 600, beyond the
// longest prefill chunk a pipeline stage waits for).
double comm_timeout_s() {
  const char* v = std::getenv("DSA_COMM_TIMEOUT");
  if (!v) return 600;
  char* end = nullptr;
  const double t = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(t >= 0) || t > 1e9) throw Error(std::string("DSA_COMM_TIMEOUT='") + v + "': expected seconds (0: no limit)");
  return t;
}

void watch() {
  while (!g_watch_stop) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const int64_t since = g_wait_since;
    if (since == 0 || g_timeout_s <= 0 || double(now_ns() - since) * 1e-9 < g_timeout_s) continue;
    // A plain exit: mpirun ends the job when a rank exits with an error (MPI_Abort belongs
    // to the main thread here).
    std::fprintf(stderr, "error: rank %d of %d: %s waited %.0f s for the other ranks (one of them hung or lost its link; DSA_COMM_TIMEOUT sets the limit)\n",
                 g_rank, g_size, g_wait_what.load(), g_timeout_s);
    std::fflush(stderr);
    std::_Exit(1);
  }
}

MPI_Comm g_stage = MPI_COMM_NULL;  // the caller's pipeline stage (MPI_COMM_WORLD until split)
// Element counts and offsets of the stage ranks' row blocks in gather_rows,
// sum_scatter_rows and exchange_rows (what arrives apart), sized with the stage (steps
// allocate nothing).
std::vector<int> g_counts, g_displs, g_recv_counts, g_recv_displs;
void size_stage(MPI_Comm stage, int n) {
  g_stage = stage;
  g_stage_size = n;
  for (auto* v : {&g_counts, &g_displs, &g_recv_counts, &g_recv_displs}) v->resize(size_t(n));
}

// MPI counts are ints: a transfer of n elements goes in pieces of at most this many.
constexpr size_t kMaxCount = size_t(std::numeric_limits<int>::max());
template <class F>
void in_pieces(size_t n, F f) {
  for (size_t off = 0; off < n; off += kMaxCount) f(off, int(std::min(kMaxCount, n - off)));
}

void bcast(void* data, size_t bytes, int root, const char* what) {
  Waiting w(what);
  auto* p = static_cast<char*>(data);
  in_pieces(bytes, [&](size_t off, int k) { MPI_Bcast(p + off, k, MPI_BYTE, root, MPI_COMM_WORLD); });
}
#endif

// The job size the launcher exported, 0 when no launcher started this process. Open MPI
// sets OMPI_COMM_WORLD_SIZE; PMI_SIZE covers MPICH-style launchers.
int launcher_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* v = std::getenv(var);
    if (!v) continue;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < 1 || n > 1 << 20)
      throw Error(std::string("MPI environment: ") + var + "='" + v + "' is not a process count");
    return int(n);
  }
  return 0;
}

}  // namespace

bool built_with_mpi() {
#ifdef DSA_HAVE_MPI
  return true;
#else
  return false;
#endif
}

void init() {
  if (g_active) return;
  const int n = launcher_size();
  if (n <= 1) return;
#ifdef DSA_HAVE_MPI
  int provided = 0;
  // Only the main thread calls MPI (the OpenMP workers never do).
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    throw Error("MPI_Init_thread failed: cannot join the mpirun job");
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  // Errors end the job (MPI_ERRORS_ARE_FATAL): a rank that dies takes the others with it
  // instead of leaving them in a collective.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  size_stage(MPI_COMM_WORLD, g_size);
  g_active = true;
  g_timeout_s = comm_timeout_s();
  std::thread(watch).detach();  // lives as long as the process (any exit path may end it)
  if (g_size != n)
    abort_job("MPI environment: the launcher announced " + std::to_string(n) + " processes, MPI_COMM_WORLD has " + std::to_string(g_size));
#else
  throw Error("started by mpirun as " + std::to_string(n) +
              " processes, but this dsa was built without MPI (install libopenmpi-dev and rebuild)");
#endif
}

bool active() { return g_active; }
int rank() { return g_rank; }
int size() { return g_size; }

void set_stage_size(int group) {
  if (!g_active || group == g_stage_size) return;
  if (group < 1 || g_size % group != 0) abort_job("pipeline stages of " + std::to_string(group) + " ranks do not divide the job");
#ifdef DSA_HAVE_MPI
  MPI_Comm stage = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, g_rank / group, g_rank, &stage);
  MPI_Comm_set_errhandler(stage, MPI_ERRORS_ARE_FATAL);
  if (g_stage != MPI_COMM_WORLD) MPI_Comm_free(&g_stage);
  size_stage(stage, group);
#endif
}

#ifdef DSA_HAVE_MPI
namespace {
template <class T> MPI_Datatype mpi_type();
template <> MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <> MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }
}  // namespace
#endif

template <class T>
static void sum_over_stage(T* data, size_t n) {
  if (!g_active || g_stage_size == 1) return;
#ifdef DSA_HAVE_MPI
  Waiting w("the all-reduce");
  in_pieces(n, [&](size_t off, int k) { MPI_Allreduce(MPI_IN_PLACE, data + off, k, mpi_type<T>(), MPI_SUM, g_stage); });
#else
  (void)data;
  (void)n;
#endif
}
void sum(float* data, size_t n) { sum_over_stage(data, n); }
void sum_f64(double* data, size_t n) { sum_over_stage(data, n); }

void gather_columns(const float* part, int rows, int cols, float* out) {
  if (!g_active || g_stage_size == 1) {
    std::copy_n(part, size_t(rows) * size_t(cols), out);
    return;
  }
#ifdef DSA_HAVE_MPI
  const int per = cols / g_stage_size;
  Waiting w("the all-gather");
  // Rank r's contiguous block lands strided in columns [r * per, (r + 1) * per): a vector
  // type of rows x per floats with a stride of cols, resized so that rank r starts r * per in.
  MPI_Datatype block, placed;
  MPI_Type_vector(rows, per, cols, MPI_FLOAT, &block);
  MPI_Type_create_resized(block, 0, MPI_Aint(per) * MPI_Aint(sizeof(float)), &placed);
  MPI_Type_commit(&placed);
  MPI_Allgather(part, rows * per, MPI_FLOAT, out, 1, placed, g_stage);
  MPI_Type_free(&placed);
  MPI_Type_free(&block);
#endif
}

#ifdef DSA_HAVE_MPI
namespace {
// Element counts and offsets (into `counts`, `displs`) of the ranks' row blocks of `cols`
// floats. MPI counts are ints: a step's rows times the width (tokens x hidden, logit rows x
// vocabulary) stay far below 2^31.
void row_layout(const int* rows, int cols, std::vector<int>& counts, std::vector<int>& displs) {
  int64_t at = 0;
  for (int r = 0; r < g_stage_size; ++r) {
    const int64_t k = int64_t(rows[r]) * cols;
    DSA_CHECK(uint64_t(at + k) <= kMaxCount, "dist: a row exchange beyond 2^31 elements");
    counts[size_t(r)] = int(k);
    displs[size_t(r)] = int(at);
    at += k;
  }
}
void row_layout(const int* rows, int cols) { row_layout(rows, cols, g_counts, g_displs); }
}  // namespace
#endif

void gather_counts(int mine, int* all) {
  if (!g_active || g_stage_size == 1) {
    all[0] = mine;
    return;
  }
#ifdef DSA_HAVE_MPI
  Waiting w("the all-gather of row counts");
  MPI_Allgather(&mine, 1, MPI_INT, all, 1, MPI_INT, g_stage);
#endif
}

void gather_rows(const float* mine, const int* counts, int cols, float* all) {
  if (!g_active || g_stage_size == 1) {
    std::copy_n(mine, size_t(counts[0]) * size_t(cols), all);
    return;
  }
#ifdef DSA_HAVE_MPI
  Waiting w("the all-gather of rows");
  row_layout(counts, cols);
  MPI_Allgatherv(mine, g_counts[size_t(g_rank % g_stage_size)], MPI_FLOAT, all, g_counts.data(), g_displs.data(), MPI_FLOAT, g_stage);
#endif
}

void sum_scatter_rows(const double* all, const int* counts, int cols, double* mine) {
  if (!g_active || g_stage_size == 1) {
    std::copy_n(all, size_t(counts[0]) * size_t(cols), mine);
    return;
  }
#ifdef DSA_HAVE_MPI
  Waiting w("the reduce-scatter");
  row_layout(counts, cols);
  MPI_Reduce_scatter(all, mine, g_counts.data(), MPI_DOUBLE, MPI_SUM, g_stage);
#endif
}

void exchange_counts(const int* send, int* recv) {
  if (!g_active || g_stage_size == 1) {
    recv[0] = send[0];
    return;
  }
#ifdef DSA_HAVE_MPI
  Waiting w("the all-to-all of row counts");
  MPI_Alltoall(send, 1, MPI_INT, recv, 1, MPI_INT, g_stage);
#endif
}

template <class T>
static void exchange_rows_of(const T* send, const int* send_rows, const int* recv_rows, int cols, T* recv) {
  if (!g_active || g_stage_size == 1) {
    std::copy_n(send, size_t(send_rows[0]) * size_t(cols), recv);
    return;
  }
#ifdef DSA_HAVE_MPI
  Waiting w("the all-to-all of rows");
  row_layout(send_rows, cols);
  row_layout(recv_rows, cols, g_recv_counts, g_recv_displs);
  MPI_Alltoallv(send, g_counts.data(), g_displs.data(), mpi_type<T>(), recv, g_recv_counts.data(), g_recv_displs.data(), mpi_type<T>(),
                g_stage);
#else
  (void)recv_rows;
#endif
}
void exchange_rows(const float* send, const int* send_rows, const int* recv_rows, int cols, float* recv) {
  exchange_rows_of(send, send_rows, recv_rows, cols, recv);
}
void exchange_rows_f64(const double* send, const int* send_rows, const int* recv_rows, int cols, double* recv) {
  exchange_rows_of(send, send_rows, recv_rows, cols, recv);
}

void send(const void* data, size_t bytes, int to) {
#ifdef DSA_HAVE_MPI
  Waiting w("a send to the next pipeline stage");
  const auto* p = static_cast<const char*>(data);
  in_pieces(bytes, [&](size_t off, int k) { MPI_Send(p + off, k, MPI_BYTE, to, 0, MPI_COMM_WORLD); });
#else
  (void)data;
  (void)bytes;
  (void)to;
#endif
}

void recv(void* data, size_t bytes, int from) {
#ifdef DSA_HAVE_MPI
  Waiting w("a receive from the previous pipeline stage");
  auto* p = static_cast<char*>(data);
  in_pieces(bytes, [&](size_t off, int k) { MPI_Recv(p + off, k, MPI_BYTE, from, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE); });
#else
  (void)data;
  (void)bytes;
  (void)from;
#endif
}

void broadcast_bytes(void* data, size_t bytes, int root) {
  if (!g_active) return;
#ifdef DSA_HAVE_MPI
  bcast(data, bytes, root, "a broadcast");
#else
  (void)data;
  (void)bytes;
  (void)root;
#endif
}

void broadcast_bytes_idle(void* data, size_t bytes, int root) {
  if (!g_active) return;
#ifdef DSA_HAVE_MPI
  if (bytes > kMaxCount) abort_job("an idle broadcast of " + std::to_string(bytes) + " bytes is beyond one MPI message");
  MPI_Request req;
  MPI_Ibcast(data, int(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &req);
  // Spin briefly (a busy server's calls follow each other closely), then sleep between polls:
  // 200 us at most added to a call that arrives after a pause.
  for (long polls = 0;; ++polls) {
    int done = 0;
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (polls > 20000) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
#else
  (void)data;
  (void)bytes;
  (void)root;
#endif
}

void broadcast(float* data, size_t n, int root) {
  if (!g_active) return;
#ifdef DSA_HAVE_MPI
  bcast(data, n * sizeof(float), root, "the logits broadcast");
#else
  (void)data;
  (void)n;
  (void)root;
#endif
}

void barrier() {
#ifdef DSA_HAVE_MPI
  Waiting w("a barrier");
  if (g_active) MPI_Barrier(MPI_COMM_WORLD);
#endif
}

double max_over_ranks(double v) {
#ifdef DSA_HAVE_MPI
  Waiting w("an all-reduce of one value");
  if (g_active) MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
#endif
  return v;
}

int node_count() {
  if (!g_active) return 1;
#ifdef DSA_HAVE_MPI
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> all(size_t(g_size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
  std::set<std::string> hosts;
  for (int r = 0; r < g_size; ++r) hosts.emplace(all.data() + size_t(r) * MPI_MAX_PROCESSOR_NAME);
  return int(hosts.size());
#else
  return 1;
#endif
}

void abort_job(const std::string& message) {
  std::fprintf(stderr, "error: rank %d of %d: %s\n", g_rank, g_size, message.c_str());
  std::fflush(stderr);
#ifdef DSA_HAVE_MPI
  if (g_active) MPI_Abort(MPI_COMM_WORLD, 1);
#endif
  std::exit(1);
}

void finalize() {
#ifdef DSA_HAVE_MPI
  g_watch_stop = true;
  if (g_active && g_stage != MPI_COMM_WORLD) MPI_Comm_free(&g_stage);
  if (g_active) MPI_Finalize();
#endif
  g_active = false;
}

}  // namespace dsa::dist
