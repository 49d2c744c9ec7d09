// make_seeds.cpp — writes small valid .crtrace files as a seed corpus for fuzz_trace_file.
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
  return 0;
}
