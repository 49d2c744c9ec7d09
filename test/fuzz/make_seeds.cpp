// make_seeds.cpp — writes small valid .crtrace files as a seed corpus for fuzz_trace_file.
#include <array>
#include <cstdio>
#include <string>

#include "crucible/record/OpBuilder.h"
#include "crucible/record/Recorder.h"
#include "crucible/record/TraceFile.h"

int main(int argc, char** argv) {
  using namespace crucible::record;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  for (int n : {0, 1, 3, 17}) {
    auto r = *Recorder::create();
    OpBuilder b;
    const auto s = r->intern_schema("aten::addmm");
    (void)r->intern_module("layer.0").value();
    for (int i = 0; i < n; ++i) {
      b.reset();
      TensorMeta m;
      m.dtype = static_cast<std::int8_t>(i % 12);
      const std::int64_t sz[3] = {i + 1, 2, 3}, st[3] = {6, 3, 1};
      b.add_tensor(m, std::span<const std::int64_t>(sz, static_cast<std::size_t>(i % 4)),
                   std::span<const std::int64_t>(st, static_cast<std::size_t>(i % 4)));
      b.end_inputs();
      b.add_tensor(m, sz, st);
      b.add_scalar(ScalarKind::ListBegin, 1, 0, 1);
      b.add_int(1, i);
      b.add_double(2, 0.5);
      r->commit(r->thread_log(), b.entry(s, static_cast<Phase>(i % 3), 0), b.cells(), b.scalars());
    }
    r->classify_external(1, ExternalKind::Parameter);
    const std::string path = std::string(argv[1]) + "/seed_" + std::to_string(n) + ".crtrace";
    if (auto st = save_trace(r->snapshot(), path); !st.ok()) {
      std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
      return 1;
    }
  }
  // A periodic step with dataflow, so that mutations reach the graph, DAG and plan: forward
  // mm on a parameter and an input, relu, a view of it; backward; an in-place optimizer update
  // of the parameter (a new version each step). Four steps, the first without the update.
  {
    auto r = *Recorder::create();
    const auto mm = r->intern_schema("aten::mm"), relu = r->intern_schema("aten::relu");
    const auto view = r->intern_schema("aten::view"), sum = r->intern_schema("aten::sum");
    const auto add = r->intern_schema("aten::add_.Tensor");
    const std::uint32_t mod = r->intern_module("layer.0").value();
    OpBuilder b;
    const std::int64_t sz[2] = {4, 4}, st[2] = {4, 1};
    auto tensor = [&](std::uint64_t storage, std::uint32_t version, bool is_view = false) {
      TensorMeta m;
      m.storage_id = storage;
      m.version = version;
      m.dtype = 6;  // float
      m.storage_nbytes = 64;
      m.data_ptr = 0x1000 * storage;
      m.flags = is_view ? tensor_flag::kIsView : 0;
      b.add_tensor(m, sz, st);
    };
    auto op = [&](std::uint64_t schema, Phase phase, std::initializer_list<std::array<std::uint64_t, 3>> ins,
                  std::initializer_list<std::array<std::uint64_t, 3>> outs) {
      b.reset();
      for (const auto& t : ins) tensor(t[0], static_cast<std::uint32_t>(t[1]), t[2] != 0);
      b.end_inputs();
      for (const auto& t : outs) tensor(t[0], static_cast<std::uint32_t>(t[1]), t[2] != 0);
      TraceEntry e = b.entry(schema, phase, 0);
      e.module_id = mod;
      r->commit(r->thread_log(), e, b.cells(), b.scalars());
    };
    for (std::uint64_t k = 0; k < 4; ++k) {
      const std::uint64_t a = 100 + 10 * k;
      op(mm, Phase::Forward, {{1, k, 0}, {2, 0, 0}}, {{a, 0, 0}});
      op(relu, Phase::Forward, {{a, 0, 0}}, {{a + 1, 0, 0}});
      op(view, Phase::Forward, {{a + 1, 0, 0}}, {{a + 1, 0, 1}});
      op(sum, Phase::Backward, {{a + 1, 0, 1}}, {{a + 2, 0, 0}});
      if (k > 0) op(add, Phase::Optimizer, {{1, k, 0}, {a + 2, 0, 0}}, {{1, k + 1, 0}});
    }
    r->classify_external(1, ExternalKind::Parameter);
    r->classify_external(2, ExternalKind::Input);
    const std::string path = std::string(argv[1]) + "/seed_steps.crtrace";
    if (auto s = save_trace(r->snapshot(), path); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  return 0;
}
