// Text helpers shared by the grading stages (results.hpp).
#include "results.hpp"

#include <algorithm>

namespace dtl::grade {

std::string first_line(const std::string& s, size_t max) {
  std::string line = s.substr(0, s.find('\n'));
  if (line.size() > max) line = line.substr(0, max) + "...";
  return line;
}

std::string gist(const std::string& s, size_t max) {
  // gtest's messages span lines ("Expected equality of these values:\n  a\n    Which is: 3\n
  // b\n    Which is: 2"): the first line alone says nothing about the values.
  std::string out;
  bool space = false;
  for (char c : s) {
    if (c == '\n' || c == '\r' || c == '\t' || c == ' ') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
    if (out.size() > max) return out.substr(0, max) + "...";
  }
  return out;
}

std::string signal_death_line(const std::string& output) {
  for (size_t at = output.find("exited on"); at != std::string::npos;
       at = output.find("exited on", at + 1)) {
    size_t k = at + 9;
    while (k < output.size() && (output[k] == ' ' || output[k] == '\n')) ++k;
    if (output.compare(k, 6, "signal") != 0) continue;
    const size_t nl = output.rfind('\n', at);
    const size_t from = nl == std::string::npos ? 0 : nl + 1;
    std::string line = output.substr(from, output.find('\n', k) - from);
    std::replace(line.begin(), line.end(), '\n', ' ');
    return line;
  }
  return "";
}

std::string not_implemented_reason(const std::string& msg) {
  auto pos = msg.find("not implemented: ");
  if (pos == std::string::npos) return "";
  std::string r = first_line(msg.substr(pos));
  auto paren = r.rfind(" (");
  return paren == std::string::npos ? r : r.substr(0, paren);
}

std::string plain(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    // ESC [ ... final byte (0x40-0x7e): a colour or cursor code.
    if (text[i] == '\033' && i + 1 < text.size() && text[i + 1] == '[') {
      size_t j = i + 2;
      while (j < text.size() && !(text[j] >= 0x40 && text[j] <= 0x7e)) ++j;
      i = j;
      continue;
    }
    out += text[i];
  }
  return out;
}

}  // namespace dtl::grade
