// tokenize: llama.cpp's own tokenizer as a reference for the text room's GGUF tokenizer
// (python/meshnet/text/tokenizer_test.py compares the two). Loads only the vocabulary of
// a GGUF (no weights), reads one JSON string per line on stdin and prints, per line, one JSON
// array of the token ids llama_tokenize gives for it.
//
// Usage: tokenize MODEL.gguf [--add-special] [--no-parse-special] < lines.jsonl
//   --add-special       add BOS/EOS as the vocabulary asks (llama_tokenize add_special)
//   --no-parse-special  treat control tokens written in the text as plain text
//        tokenize MODEL.gguf --vocab
//   prints one JSON object instead: bos, eos, eot, add_bos, eog (every id llama_vocab_is_eog
//   accepts), and per token id the bytes of its piece in hex, with special tokens rendered
//   ("pieces") and suppressed ("plain_pieces") as llama_token_to_piece gives them.
// Exit status: 0; 1 when the model cannot be loaded; 2 on a bad argument or input line.
#include <cctype>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "llama-cpp.h"
#include "llama.h"

namespace {

// Errors only: the vocabulary load logs a page of details at INFO level.
void QuietLog(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::cerr << text;
}

void AppendUtf8(uint32_t cpt, std::string* out) {
  if (cpt < 0x80) {
    out->push_back(static_cast<char>(cpt));
  } else if (cpt < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cpt >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

// Four hex digits at line[*pos]; advances *pos.
std::optional<uint32_t> ReadHex4(const std::string& line, size_t* pos) {
  if (*pos + 4 > line.size()) return std::nullopt;
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) {
    const char c = line[(*pos)++];
    value <<= 4;
    if (c >= '0' && c <= '9') {
      value |= c - '0';
    } else if (c >= 'a' && c <= 'f') {
      value |= c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      value |= c - 'A' + 10;
    } else {
      return std::nullopt;
    }
  }
  return value;
}

// The UTF-8 text of a line holding exactly one JSON string; nullopt when it is anything else
// (including a lone surrogate escape).
std::optional<std::string> ParseJsonString(const std::string& line) {
  size_t pos = 0;
  while (pos < line.size() && std::isspace(static_cast<unsigned char>(line[pos]))) ++pos;
  if (pos == line.size() || line[pos++] != '"') return std::nullopt;
  std::string out;
  while (pos < line.size() && line[pos] != '"') {
    const char c = line[pos++];
    if (static_cast<unsigned char>(c) < 0x20) return std::nullopt;
    if (c != '\\') {
      out.push_back(c);
      continue;
    }
    if (pos == line.size()) return std::nullopt;
    const char escape = line[pos++];
    switch (escape) {
      case '"': case '\\': case '/': out.push_back(escape); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'u': {
        std::optional<uint32_t> cpt = ReadHex4(line, &pos);
        if (!cpt || (*cpt >= 0xDC00 && *cpt < 0xE000)) return std::nullopt;
        if (*cpt >= 0xD800 && *cpt < 0xDC00) {
          if (line.compare(pos, 2, "\\u") != 0) return std::nullopt;
          pos += 2;
          std::optional<uint32_t> low = ReadHex4(line, &pos);
          if (!low || *low < 0xDC00 || *low >= 0xE000) return std::nullopt;
          cpt = 0x10000 + ((*cpt - 0xD800) << 10) + (*low - 0xDC00);
        }
        AppendUtf8(*cpt, &out);
        break;
      }
      default: return std::nullopt;
    }
  }
  if (pos == line.size()) return std::nullopt;  // no closing quote
  ++pos;
  while (pos < line.size() && std::isspace(static_cast<unsigned char>(line[pos]))) ++pos;
  if (pos != line.size()) return std::nullopt;
  return out;
}

std::vector<llama_token> Tokenize(const llama_vocab* vocab, const std::string& text,
                                  bool add_special, bool parse_special) {
  std::vector<llama_token> tokens(text.size() + 8);
  int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                             static_cast<int32_t>(tokens.size()), add_special, parse_special);
  if (n < 0) {
    tokens.resize(-n);
    n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                       static_cast<int32_t>(tokens.size()), add_special, parse_special);
  }
  tokens.resize(n < 0 ? 0 : n);
  return tokens;
}

std::string PieceHex(const llama_vocab* vocab, llama_token token, bool special) {
  std::vector<char> piece(64);
  int32_t n = llama_token_to_piece(vocab, token, piece.data(), static_cast<int32_t>(piece.size()),
                                   /*lstrip=*/0, special);
  if (n < 0) {
    piece.resize(-n);
    n = llama_token_to_piece(vocab, token, piece.data(), static_cast<int32_t>(piece.size()), 0,
                             special);
  }
  static const char* kDigits = "0123456789abcdef";
  std::string hex;
  for (int32_t i = 0; i < n; ++i) {
    const auto byte = static_cast<unsigned char>(piece[i]);
    hex.push_back(kDigits[byte >> 4]);
    hex.push_back(kDigits[byte & 0xF]);
  }
  return hex;
}

void PrintVocab(const llama_vocab* vocab) {
  const int32_t n_tokens = llama_vocab_n_tokens(vocab);
  std::cout << "{\"bos\": " << llama_vocab_bos(vocab) << ", \"eos\": " << llama_vocab_eos(vocab)
            << ", \"eot\": " << llama_vocab_eot(vocab) << ", \"add_bos\": "
            << (llama_vocab_get_add_bos(vocab) ? "true" : "false") << ", \"eog\": [";
  const char* separator = "";
  for (llama_token token = 0; token < n_tokens; ++token) {
    if (!llama_vocab_is_eog(vocab, token)) continue;
    std::cout << separator << token;
    separator = ", ";
  }
  for (const bool special : {true, false}) {
    std::cout << (special ? "], \"pieces\": [" : "], \"plain_pieces\": [");
    for (llama_token token = 0; token < n_tokens; ++token) {
      std::cout << (token ? ", \"" : "\"") << PieceHex(vocab, token, special) << "\"";
    }
  }
  std::cout << "]}" << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage =
      "usage: tokenize MODEL.gguf [--add-special] [--no-parse-special] | MODEL.gguf --vocab\n";
  if (argc < 2) {
    std::cerr << usage;
    return 2;
  }
  bool add_special = false;
  bool parse_special = true;
  bool vocab_summary = false;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--add-special") == 0) {
      add_special = true;
    } else if (std::strcmp(argv[i], "--no-parse-special") == 0) {
      parse_special = false;
    } else if (std::strcmp(argv[i], "--vocab") == 0) {
      vocab_summary = true;
    } else {
      std::cerr << usage;
      return 2;
    }
  }
  llama_log_set(QuietLog, nullptr);
  llama_backend_init();
  llama_model_params params = llama_model_default_params();
  params.vocab_only = true;
  llama_model_ptr model(llama_model_load_from_file(argv[1], params));
  if (!model) {
    std::cerr << "tokenize: cannot load the vocabulary of " << argv[1] << "\n";
    return 1;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model.get());
  if (vocab_summary) PrintVocab(vocab);
  std::string line;
  for (int line_number = 1; !vocab_summary && std::getline(std::cin, line); ++line_number) {
    std::optional<std::string> text = ParseJsonString(line);
    if (!text) {
      std::cerr << "tokenize: line " << line_number << " is not one JSON string\n";
      return 2;
    }
    const std::vector<llama_token> tokens = Tokenize(vocab, *text, add_special, parse_special);
    std::cout << "[";
    for (size_t i = 0; i < tokens.size(); ++i) std::cout << (i ? ", " : "") << tokens[i];
    std::cout << "]\n" << std::flush;
  }
  model.reset();
  llama_backend_free();
  return 0;
}
