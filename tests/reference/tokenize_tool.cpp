// Our tokenizer (data.tokenizer) on the command line, for tests/reference/check_sentencepiece.py:
// `tokenize_tool MODEL` reads JSON lines on stdin, {"text": T} or {"ids": [...]}, and writes one
// line each, {"ids": encode(T)} or {"text": decode(ids)}. MODEL "" is the byte tokenizer.
// A bad model or line: one line on stderr, exit 1.
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "data/tokenizer.h"
#include "tensor/error.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: tokenize_tool MODEL < requests.jsonl\n";
    return 2;
  }
  try {
    const auto tok = fsdp::load_tokenizer(argv[1]);
    std::string line;
    while (std::getline(std::cin, line)) {
      const nlohmann::json request = nlohmann::json::parse(line);
      nlohmann::json reply;
      if (request.contains("text")) {
        reply["ids"] = tok->encode(request.at("text").get<std::string>());
      } else {
        const auto ids = request.at("ids").get<std::vector<int32_t>>();
        reply["text"] = tok->decode(ids);
      }
      std::cout << reply.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    }
  } catch (const std::exception& e) {
    std::cerr << "tokenize_tool: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
