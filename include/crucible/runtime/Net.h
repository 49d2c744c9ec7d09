// Net.h — an inference network as a small graph of runtime layers, compiled once into a plan
// that runs with no allocation: every activation lives in one preplanned arena.
//
//   Net net;
//   Value x = net.input("image", {1, 1, 44, 100});
//   x = net.conv2d(x, spec, weight, bias);          // weights copied and packed here
//   x = net.batchnorm2d(x, mean, var, gamma, beta);  // folded into the conv by compile()
//   x = net.activation(x, Activation::Relu);         // fused into the conv's epilogue
//   ...
//   net.output("logits", y);
//   Result<CompiledNet> plan = net.compile();        // the first builder error, if any, here
//   plan->run({input_ptr}, {output_ptr});
//
// Builder calls never throw: a bad shape or parameter is recorded (the first one wins, naming
// the node) and returned by compile(), so a model-building function reads straight through.
//
// compile() (each step optional through CompileOptions):
//  - folds an eval-mode batchnorm into the convolution before it (weights and bias rescaled)
//    when the convolution's output feeds nothing else;
//  - fuses an activation into the conv/linear epilogue before it, likewise;
//  - runs remaining activations and affine maps in place when their input dies there;
//  - plans the arena: each value's lifetime is [producer, last consumer] (views extend their
//    base's), blocks are placed greedily by size at the lowest offset free over that lifetime,
//    64-byte aligned; conv workspaces are values live for their one step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "crucible/core/Status.h"
#include "crucible/runtime/Conv2d.h"
#include "crucible/runtime/Layers.h"
#include "crucible/runtime/Linear.h"

namespace crucible::runtime {

struct Value {
  std::uint32_t id = UINT32_MAX;
  bool valid() const { return id != UINT32_MAX; }
};

struct CompileOptions {
  bool fold_batchnorm = true;
  bool fuse_activations = true;
  bool in_place = true;
};

class CompiledNet;

class Net {
 public:
  Net();
  ~Net();
  Net(Net&&) noexcept;
  Net& operator=(Net&&) noexcept;

  Value input(std::string name, std::vector<std::int64_t> shape);
  void output(std::string name, Value v);

  // x: [n, c, h, w].
  Value conv2d(Value x, const Conv2dSpec& spec, std::span<const float> weight,
               std::span<const float> bias = {});
  // x: [..., in_features] (any leading dims).
  Value linear(Value x, std::int64_t in_features, std::int64_t out_features,
               std::span<const float> weight, std::span<const float> bias = {});
  Value activation(Value x, Activation act);
  // x: [n, c, ...]; eval-mode statistics.
  Value batchnorm2d(Value x, std::span<const float> mean, std::span<const float> var,
                    std::span<const float> gamma = {}, std::span<const float> beta = {},
                    double eps = 1e-5);
  // Normalizes over the last normalized_shape.size() dims, which must equal normalized_shape.
  Value layernorm(Value x, std::vector<std::int64_t> normalized_shape,
                  std::span<const float> gamma = {}, std::span<const float> beta = {},
                  double eps = 1e-5);
  Value softmax(Value x, std::int64_t dim);  // negative dim counts from the end
  Value maxpool2d(Value x, const Pool2dSpec& spec);
  Value avgpool2d(Value x, const Pool2dSpec& spec);
  Value adaptive_avgpool2d(Value x, std::int64_t out_h, std::int64_t out_w);
  Value pad2d(Value x, const Pad2dSpec& spec);
  Value add(Value a, Value b);
  Value mul(Value a, Value b);
  Value flatten(Value x, std::int64_t start_dim = 1, std::int64_t end_dim = -1);
  Value reshape(Value x, std::vector<std::int64_t> shape);  // one -1 allowed
  Value concat(std::span<const Value> xs, std::int64_t dim);

  // Shape of a value; empty for an invalid one.
  std::vector<std::int64_t> shape(Value v) const;
  // The first builder error (OK when none).
  Status status() const;

  Result<CompiledNet> compile(const CompileOptions& options = {}) const;

 private:
  friend class CompiledNet;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class CompiledNet {
 public:
  CompiledNet();
  ~CompiledNet();
  CompiledNet(CompiledNet&&) noexcept;
  CompiledNet& operator=(CompiledNet&&) noexcept;

  // inputs[i] / outputs[i] follow the order of input() / output() calls; each points to a
  // contiguous float32 buffer of that value's numel. One run at a time per CompiledNet: a
  // concurrent call gets an error, not a race.
  Status run(std::span<const float* const> inputs, std::span<float* const> outputs);
  // Runs `iterations` times and returns each step's median wall time in microseconds (steps as
  // describe() lists them), for finding where a network's time goes.
  Result<std::vector<double>> profile(std::span<const float* const> inputs,
                                      std::span<float* const> outputs, int iterations);

  std::size_t input_count() const;
  std::size_t output_count() const;
  const std::string& input_name(std::size_t i) const;
  const std::string& output_name(std::size_t i) const;
  std::vector<std::int64_t> input_shape(std::size_t i) const;
  std::vector<std::int64_t> output_shape(std::size_t i) const;

  // The planned arena, the sum of every planned block's bytes (what a plan without reuse would
  // need), the largest total of simultaneously live bytes (a lower bound for any plan), and the
  // packed weights' bytes.
  std::size_t arena_bytes() const;
  std::size_t unshared_bytes() const;
  std::size_t live_peak_bytes() const;
  std::size_t weight_bytes() const;
  // One line per step: kind, fused epilogue, shapes, arena offsets.
  std::string describe() const;

 private:
  friend class Net;
  Status run_timed(std::span<const float* const> inputs, std::span<float* const> outputs,
                   double* step_us);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace crucible::runtime
