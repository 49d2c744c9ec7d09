// fuzz_pt_make_seeds.cpp — writes small valid .pt archives (for fuzz_pt_zip) and their pickles
// (for fuzz_pt_pickle) as seed corpora.
// Usage: fuzz_pt_make_seeds ZIP_CORPUS_DIR PICKLE_CORPUS_DIR
#include <cstdio>
#include <string>
#include <vector>

#include "../ptload/zip_writer.h"

int main(int argc, char** argv) {
  using namespace crucible::ptload::test;
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s ZIP_CORPUS_DIR PICKLE_CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::string od = global("collections", "OrderedDict") + ")R";
  const std::vector<std::string> pickles = {
      "\x80\x02N.",
      "\x80\x02}(" + uni("w") + tensor_f32("0", 4, 0, 4) + uni("b") + tensor_f32("0", 4, 1, 2) +
          "u.",
      "\x80\x02" + od + "q\x00(" + uni("x") + tensor_f32("0", 4, 2, 2) + uni("step") + "K\x03u}" +
          uni("_metadata") + "\x88sb.",
      "\x80\x02](K\x01G\x3f\xf0\x00\x00\x00\x00\x00\x00" + uni("s") + "\x8a\x09" +
          std::string(9, '\x01') + "\x88\x89N" + global("torch", "Size") + "(K\x02K\x03t\x85R" +
          global("torch", "float16") + "e.",
      "\x80\x02" + global("torch._utils", "_rebuild_parameter") + "(" + tensor_f32("0", 4, 0, 3) +
          "\x88" + od + "tR.",
  };
  int n = 0;
  for (const auto& p : pickles) {
    const std::string zip = make_pt(p, {{1, 2, 3, 4}});
    const std::string deflated =
        make_zip({{"a/data.pkl", p, true},
                  {"a/data/0", std::string("\0\0\x80?\0\0\0@\0\0@@\0\0\x80@", 16)},
                  {"a/byteorder", "little"}});
    for (const auto& [dir, bytes] :
         {std::pair{argv[1], zip}, std::pair{argv[1], deflated}, std::pair{argv[2], p}}) {
      const std::string path = std::string(dir) + "/seed_" + std::to_string(n++);
      std::FILE* f = std::fopen(path.c_str(), "wb");
      if (!f) {
        std::perror(path.c_str());
        return 1;
      }
      std::fwrite(bytes.data(), 1, bytes.size(), f);
      std::fclose(f);
    }
  }
  std::printf("fuzz_pt_make_seeds: %d seeds\n", n);
  return 0;
}
