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
// data[0:n] summed over the ranks, in place on every rank.
void sum(float* data, size_t n);
// Each rank's [rows, cols / size()] block into its columns of out [rows, cols], on every
// rank (cols a multiple of size()).
void gather_columns(const float* part, int rows, int cols, float* out);
void barrier();
double max_over_ranks(double v);  // the largest v any rank passes (every rank receives it)
// Ends the job on every rank: the message on stderr, naming this rank, then MPI_Abort (the
// other ranks stop in whatever collective they wait in, instead of hanging).
[[noreturn]] void abort_job(const std::string& message);
void finalize();

}  // namespace dsa::dist
