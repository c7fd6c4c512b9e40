// Gloo's AllreduceRingChunked and AllreduceHalvingDoubling (float32 sum) over Gloo's TCP
// transport, printed as JSON lines for bench/compare_tcp.py. Rank and size come from dtrain-run's
// variables (DTRAIN_RANK, DTRAIN_WORLD_SIZE); ranks meet through Gloo's FileStore in a directory
// given as the first argument.
//   dtrain-run -n P gloo_allreduce /tmp/dir SIZES...
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

template <class Algorithm>
void measure(const char* name, const std::shared_ptr<gloo::rendezvous::Context>& ctx, std::size_t bytes,
             double seconds) {
  const int rank = ctx->rank, size = ctx->size;
  const std::size_t n = bytes / sizeof(float);
  std::vector<float> data(n);
  auto fill = [&] {
    for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 7));
  };
  fill();
  Algorithm algo(ctx, std::vector<float*>{data.data()}, static_cast<int>(n));
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  algo.run();
  algo.run();
  double one = std::chrono::duration<double>(clock::now() - t0).count() / 2;
  // Every rank must run the same count: rank 0's estimate travels by allreduce (max).
  std::vector<float> iters{static_cast<float>(std::clamp(seconds / std::max(one, 1e-7), 3.0, 10000.0))};
  gloo::AllreduceRingChunked<float> agree(ctx, std::vector<float*>{iters.data()}, 1,
                                          gloo::ReductionFunction<float>::max);
  agree.run();
  const int count = static_cast<int>(iters[0]);
  t0 = clock::now();
  for (int i = 0; i < count; ++i) algo.run();
  std::vector<float> t{static_cast<float>(std::chrono::duration<double>(clock::now() - t0).count() / count)};
  gloo::AllreduceRingChunked<float> slowest(ctx, std::vector<float*>{t.data()}, 1, gloo::ReductionFunction<float>::max);
  slowest.run();
  fill();
  algo.run();
  long wrong = 0;
  const float total = static_cast<float>(size * (size + 1) / 2);
  for (std::size_t i = 0; i < n; ++i) wrong += data[i] != total * static_cast<float>(i % 7);
  double algbw = static_cast<double>(bytes) / t[0] / 1e9;
  if (rank == 0) {
    std::printf("{\"peer\": \"gloo\", \"algorithm\": \"%s\", \"ranks\": %d, \"bytes\": %zu, \"time_us\": %.3f, "
                "\"algbw_GBps\": %.4f, \"busbw_GBps\": %.4f, \"wrong\": %ld}\n",
                name, size, bytes, static_cast<double>(t[0]) * 1e6, algbw, algbw * 2.0 * (size - 1) / size, wrong);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: gloo_allreduce STORE_DIR SIZE...\n");
    return 2;
  }
  const int rank = std::atoi(std::getenv("DTRAIN_RANK"));
  const int size = std::atoi(std::getenv("DTRAIN_WORLD_SIZE"));
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(argv[1]);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->connectFullMesh(store, dev);
  double seconds = 0.3;
  for (int i = 2; i < argc; ++i) {
    std::size_t bytes = std::strtoull(argv[i], nullptr, 10);
    measure<gloo::AllreduceRingChunked<float>>("AllreduceRingChunked", ctx, bytes, seconds);
    measure<gloo::AllreduceHalvingDoubling<float>>("AllreduceHalvingDoubling", ctx, bytes, seconds);
  }
}
