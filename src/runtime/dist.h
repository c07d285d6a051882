#pragma once
// The processes of one MPI job (mpirun -np N dsa ...). Without MPI in the build, or in a
// process that mpirun did not start, there is one rank and nothing here communicates.
#include <cstddef>
#include <string>

namespace dsa::dist {

bool built_with_mpi();
// Joins the job when the environment says mpirun started this process; one rank otherwise.
// Throws dsa::Error when the environment is malformed or this build has no MPI.
void init();
bool active();  // in a job of more than one rank
int rank();
int size();
// Groups the ranks into stages of `group` consecutive ranks (a pipeline layout); until
// then the whole job is one stage. sum and gather_columns run within the caller's stage.
void set_stage_size(int group);
// data[0:n] summed over the stage's ranks, in place on each of them. The double form carries
// the expert-parallel MoE's partial outputs (moe.cpp says why they are not rounded first).
void sum(float* data, size_t n);
void sum_f64(double* data, size_t n);
// Each stage rank's [rows, cols / stage size] block into its columns of out [rows, cols],
// on each of them (cols a multiple of the stage size).
void gather_columns(const float* part, int rows, int cols, float* out);
// Data-parallel attention, over the caller's stage: each rank's `mine` into all[stage
// size]; the ranks' [counts[r], cols] row blocks into all, in rank order; and the sum over
// the ranks of all [sum of counts, cols], each rank keeping rows of its own block in mine.
void gather_counts(int mine, int* all);
void gather_rows(const float* mine, const int* counts, int cols, float* all);
void sum_scatter_rows(const double* all, const int* counts, int cols, double* mine);
// All-to-all over the caller's stage: send[r] to member r and recv[r] from it (one int
// each); and rows of `cols` floats, send_rows[r] of them for member r (blocks in member order
// in `send`) arriving as recv_rows[r] rows from member r (blocks in member order in `recv`);
// the same for rows of doubles.
void exchange_counts(const int* send, int* recv);
void exchange_rows(const float* send, const int* send_rows, const int* recv_rows, int cols, float* recv);
void exchange_rows_f64(const double* send, const int* send_rows, const int* recv_rows, int cols, double* recv);
// Point to point between world ranks (blocking), and a broadcast from `root` to every rank.
void send(const void* data, size_t bytes, int to);
void recv(void* data, size_t bytes, int from);
void broadcast(float* data, size_t n, int root);
void broadcast_bytes(void* data, size_t bytes, int root);
// The same for a broadcast the other ranks may wait on for long (a server's next call): they
// poll with short sleeps instead of spinning a core, as MPI's blocking calls do. Matches only
// itself (every rank must call this one, not broadcast_bytes, for the same message).
void broadcast_bytes_idle(void* data, size_t bytes, int root);
void barrier();
double max_over_ranks(double v);  // the largest v any rank passes (every rank receives it)
int node_count();                  // distinct hosts (MPI processor names) the job's ranks run on
// Ends the job on every rank: the message on stderr, naming this rank, then MPI_Abort (the
// other ranks stop in whatever collective they wait in, instead of hanging).
[[noreturn]] void abort_job(const std::string& message);
void finalize();

}  // namespace dsa::dist
