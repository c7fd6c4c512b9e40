// Open MPI's MPI_Allreduce (float32 sum) in the same columns and JSON as bench_collectives, for
// bench/compare_tcp.py. Run: mpirun --mca btl tcp,self --mca pml ob1 -np P mpi_allreduce SIZES...
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  double seconds = 0.3;
  std::vector<std::size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-t" && i + 1 < argc) seconds = std::atof(argv[++i]);
    else sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  }
  for (std::size_t bytes : sizes) {
    const std::size_t n = bytes / sizeof(float);
    std::vector<float> in(n), out(n);
    for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 7));
    auto call = [&] { MPI_Allreduce(in.data(), out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); };
    double t0 = MPI_Wtime();
    call();
    call();
    double iters = std::clamp(seconds / std::max((MPI_Wtime() - t0) / 2, 1e-7), 3.0, 10000.0);
    MPI_Bcast(&iters, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int i = 0; i < static_cast<int>(iters); ++i) call();
    double t = (MPI_Wtime() - t0) / static_cast<int>(iters), slowest = 0;
    MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    long wrong = 0;
    const float total = static_cast<float>(size * (size + 1) / 2);
    for (std::size_t i = 0; i < n; ++i) wrong += out[i] != total * static_cast<float>(i % 7);
    double algbw = static_cast<double>(bytes) / slowest / 1e9;
    if (rank == 0) {
      std::printf("{\"peer\": \"openmpi\", \"algorithm\": \"MPI_Allreduce\", \"ranks\": %d, \"bytes\": %zu, "
                  "\"time_us\": %.3f, \"algbw_GBps\": %.4f, \"busbw_GBps\": %.4f, \"wrong\": %ld}\n",
                  size, bytes, slowest * 1e6, algbw, algbw * 2.0 * (size - 1) / size, wrong);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
}
