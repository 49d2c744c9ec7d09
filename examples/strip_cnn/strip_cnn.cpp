// strip_cnn.cpp — runs a PyTorch-trained CNN with no Python: loads the state dict with ptload,
// builds the network with the runtime's layers, and checks it against PyTorch's own outputs.
//
//   strip_cnn MODEL.pt HELDOUT.pt [--dump-logits FILE]
//                                      predictions on the held-out strips must equal PyTorch's
//                                      and every logit must be within 1e-5 (exit 0), else exit 1;
//                                      FILE gets the raw float32 logits [n, 4, 10]
//   strip_cnn --bench N MODEL.pt       N single-strip forwards: median latency and peak RSS
//
// The network is StripNet from train.py: 3 x (conv3x3 + batchnorm + relu [+ maxpool2]),
// adaptive average pooling to 2x4, the 8-value pose vector concatenated to the 512 features, a
// 192-wide hidden layer and four 10-way heads (one per digit). compile() folds each batchnorm
// into its convolution and fuses the relus into the conv/linear epilogues.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "crucible/ptload/StateDict.h"
#include "crucible/runtime/Net.h"
#include "crucible/runtime/Weights.h"

namespace {

using crucible::Result;
using crucible::Status;
namespace rt = crucible::runtime;
namespace pt = crucible::ptload;

constexpr std::int64_t kH = 44, kW = 100, kPose = 8, kHidden = 192, kDigits = 4, kClasses = 10;

Result<rt::CompiledNet> build_strip_net(const pt::StateDict& sd, std::int64_t batch) {
  rt::Weights wts(sd);
  rt::Net net;
  rt::Value x = net.input("image", {batch, 1, kH, kW});
  const rt::Value pose = net.input("pose", {batch, kPose});
  struct Block {
    int conv, bn;  // indices in trunk (nn.Sequential)
    std::int64_t in, out;
    bool pool;
  };
  const Block blocks[] = {{0, 1, 1, 16, true}, {4, 5, 16, 32, true}, {8, 9, 32, 64, false}};
  for (const Block& b : blocks) {
    const std::string conv = "trunk." + std::to_string(b.conv), bn = "trunk." + std::to_string(b.bn);
    auto w = wts.get(conv + ".weight", {b.out, b.in, 3, 3});
    auto bias = wts.get(conv + ".bias", {b.out});
    auto mean = wts.get(bn + ".running_mean", {b.out});
    auto var = wts.get(bn + ".running_var", {b.out});
    auto gamma = wts.get(bn + ".weight", {b.out});
    auto beta = wts.get(bn + ".bias", {b.out});
    for (const Status& s : {w.status(), bias.status(), mean.status(), var.status(), gamma.status(), beta.status()}) {
      if (!s.ok()) return s;
    }
    rt::Conv2dSpec spec;
    spec.in_channels = b.in;
    spec.out_channels = b.out;
    spec.kernel_h = spec.kernel_w = 3;
    spec.pad_h = spec.pad_w = 1;
    x = net.conv2d(x, spec, *w, *bias);
    x = net.batchnorm2d(x, *mean, *var, *gamma, *beta, 1e-5);
    x = net.activation(x, rt::Activation::Relu);
    if (b.pool) {
      rt::Pool2dSpec pool;
      pool.kernel_h = pool.kernel_w = pool.stride_h = pool.stride_w = 2;
      x = net.maxpool2d(x, pool);
    }
  }
  x = net.adaptive_avgpool2d(x, 2, 4);
  x = net.flatten(x, 1);
  const rt::Value parts[] = {x, pose};
  x = net.concat(parts, 1);
  const std::int64_t features = 64 * 2 * 4 + kPose;
  auto fc_w = wts.get("fc.weight", {kHidden, features});
  auto fc_b = wts.get("fc.bias", {kHidden});
  if (!fc_w.ok()) return fc_w.status();
  if (!fc_b.ok()) return fc_b.status();
  x = net.activation(net.linear(x, features, kHidden, *fc_w, *fc_b), rt::Activation::Relu);
  std::vector<rt::Value> heads;
  for (std::int64_t j = 0; j < kDigits; ++j) {
    const std::string name = "heads." + std::to_string(j);
    auto hw = wts.get(name + ".weight", {kClasses, kHidden});
    auto hb = wts.get(name + ".bias", {kClasses});
    if (!hw.ok()) return hw.status();
    if (!hb.ok()) return hb.status();
    heads.push_back(net.reshape(net.linear(x, kHidden, kClasses, *hw, *hb), {batch, 1, kClasses}));
  }
  net.output("logits", net.concat(heads, 1));
  // Every tensor of the checkpoint must have been used: a leftover means another architecture.
  if (auto unused = wts.unused(); !unused.empty()) {
    return crucible::invalid_input("the state dict has tensors StripNet does not use, e.g. '" + unused[0] + "'",
                                   "pass a checkpoint written by examples/strip_cnn/train.py");
  }
  return net.compile();
}

// Peak resident set of this process: VmHWM, not getrusage's ru_maxrss, which Linux carries over
// exec() from the parent (a benchmark started from Python would report Python's memory).
long peak_rss_kb() {
  long kb = -1;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      if (std::strncmp(line, "VmHWM:", 6) == 0) kb = std::strtol(line + 6, nullptr, 10);
    }
    std::fclose(f);
  }
  if (kb < 0) {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    kb = ru.ru_maxrss;
  }
  return kb;
}

int check(const char* model_path, const char* heldout_path, const char* dump_path) {
  auto sd = pt::StateDict::open(model_path);
  if (!sd.ok()) {
    std::fprintf(stderr, "strip_cnn: %s: %s\n", model_path, std::string(sd.status().message()).c_str());
    return 2;
  }
  auto held = pt::StateDict::open(heldout_path);
  if (!held.ok()) {
    std::fprintf(stderr, "strip_cnn: %s: %s\n", heldout_path, std::string(held.status().message()).c_str());
    return 2;
  }
  auto net = build_strip_net(*sd, 1);
  if (!net.ok()) {
    std::fprintf(stderr, "strip_cnn: %s\n", std::string(net.status().message()).c_str());
    return 2;
  }
  const pt::TensorView* image = held->find("image");
  const pt::TensorView* pose = held->find("pose");
  const pt::TensorView* labels = held->find("labels");
  const pt::TensorView* logits = held->find("logits");
  if (!image || !pose || !labels || !logits || image->ndim() != 4 || logits->ndim() != 3) {
    std::fprintf(stderr, "strip_cnn: %s lacks image/pose/labels/logits of the expected ranks\n", heldout_path);
    return 2;
  }
  const std::int64_t n = image->sizes()[0];
  const std::vector<float> images = image->materialize_f32(), poses = pose->materialize_f32();
  const std::vector<float> want = logits->materialize_f32(), truth = labels->materialize_f32();
  std::vector<float> got(kDigits * kClasses);
  std::vector<float> all;  // every logit, for --dump-logits
  std::int64_t same_pred = 0, correct = 0;
  double max_diff = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* in[] = {images.data() + i * kH * kW, poses.data() + i * kPose};
    float* out[] = {got.data()};
    if (Status s = net->run(in, out); !s.ok()) {
      std::fprintf(stderr, "strip_cnn: %s\n", std::string(s.message()).c_str());
      return 2;
    }
    all.insert(all.end(), got.begin(), got.end());
    for (std::int64_t d = 0; d < kDigits; ++d) {
      const float* g = got.data() + d * kClasses;
      const float* w = want.data() + (i * kDigits + d) * kClasses;
      const auto pg = std::max_element(g, g + kClasses) - g;
      const auto pw = std::max_element(w, w + kClasses) - w;
      same_pred += pg == pw;
      correct += pg == static_cast<std::int64_t>(truth[static_cast<std::size_t>(i * kDigits + d)]);
      for (std::int64_t c = 0; c < kClasses; ++c) max_diff = std::max(max_diff, std::fabs(double(g[c]) - w[c]));
    }
  }
  const std::int64_t total = n * kDigits;
  if (dump_path != nullptr) {  // raw float32 logits [n, 4, 10], native byte order
    FILE* f = std::fopen(dump_path, "wb");
    if (f == nullptr || std::fwrite(all.data(), sizeof(float), all.size(), f) != all.size()) {
      std::fprintf(stderr, "strip_cnn: cannot write %s\n", dump_path);
      if (f) std::fclose(f);
      return 2;
    }
    std::fclose(f);
  }

  std::printf("strip_cnn (%s kernels): %lld strips, predictions equal to PyTorch's: %lld/%lld, "
              "digit accuracy %.2f%%, max |logit - PyTorch| = %.3g\n",
              std::string(rt::isa_name(rt::current_isa())).c_str(), static_cast<long long>(n),
              static_cast<long long>(same_pred), static_cast<long long>(total),
              100.0 * double(correct) / double(total), max_diff);
  std::printf("  arena %zu B, weights %zu B, peak RSS %ld kB\n", net->arena_bytes(), net->weight_bytes(),
              peak_rss_kb());
  const bool ok = same_pred == total && max_diff <= 1e-5;
  if (!ok) std::printf("FAIL: predictions differ or a logit is further than 1e-5 from PyTorch's\n");
  return ok ? 0 : 1;
}

// Loads the checkpoint, builds the batch-1 network and lets the state dict go: the compiled
// network holds its own packed weights, so the file is unmapped before anything runs.
Result<rt::CompiledNet> load_strip_net(const char* model_path) {
  auto sd = pt::StateDict::open(model_path);
  if (!sd.ok()) return sd.status();
  return build_strip_net(*sd, 1);
}

int bench(long iters, const char* model_path) {
  auto net = load_strip_net(model_path);
  if (!net.ok()) {
    std::fprintf(stderr, "strip_cnn: %s: %s\n", model_path, std::string(net.status().message()).c_str());
    return 2;
  }
  std::vector<float> image(kH * kW), pose(kPose), out(kDigits * kClasses);
  std::uint32_t state = 12345;  // any input: the work does not depend on values
  for (float& v : image) v = static_cast<float>((state = state * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
  const float* in[] = {image.data(), pose.data()};
  float* outs[] = {out.data()};
  std::vector<double> us;
  for (long i = 0; i < iters + 20; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (Status s = net->run(in, outs); !s.ok()) return 2;
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= 20) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(us.begin(), us.end());
  if (std::getenv("CRUCIBLE_PROFILE") != nullptr) {
    auto prof = net->profile(in, outs, 200);
    std::fprintf(stderr, "%s", net->describe().c_str());
    for (double v : *prof) std::fprintf(stderr, "%.1f ", v);
    std::fprintf(stderr, "\n");
  }
  std::printf("{\"isa\": \"%s\", \"iters\": %ld, \"median_us\": %.2f, \"p10_us\": %.2f, \"p90_us\": %.2f, "
              "\"peak_rss_kb\": %ld, \"arena_bytes\": %zu, \"weight_bytes\": %zu}\n",
              std::string(rt::isa_name(rt::current_isa())).c_str(), iters, us[us.size() / 2],
              us[us.size() / 10], us[us.size() * 9 / 10], peak_rss_kb(), net->arena_bytes(),
              net->weight_bytes());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--bench") == 0) {
    const long n = std::strtol(argv[2], nullptr, 10);
    if (n < 1) {
      std::fprintf(stderr, "strip_cnn: --bench needs a positive iteration count\n");
      return 2;
    }
    return bench(n, argv[3]);
  }
  if (argc == 3) return check(argv[1], argv[2], nullptr);
  if (argc == 5 && std::strcmp(argv[3], "--dump-logits") == 0) return check(argv[1], argv[2], argv[4]);
  std::fprintf(stderr,
               "usage: strip_cnn MODEL.pt HELDOUT.pt [--dump-logits FILE]\n"
               "                                         compare with PyTorch's held-out logits\n"
               "       strip_cnn --bench N MODEL.pt      latency and peak RSS of N forwards\n"
               "(train.py in this directory writes both files)\n");
  return 2;
}
