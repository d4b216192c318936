// Log hygiene (issue 11): repeated warnings said once then counted, values quoted short, raw bytes escaped.
#include <catch2/catch.hpp>

#include <regex>

#include <spdlog/pattern_formatter.h>

#include "pi0/common/log_line.h"
#include "pi0/common/logging.h"
#include "pi0/common/strings.h"
#include "support/log_capture.h"

using namespace pi0;
using Catch::Contains;
using testing::LogCapture;

TEST_CASE("printable escapes control bytes and malformed UTF-8 and keeps well-formed UTF-8", "[unit][common][inputs]") {
  CHECK(printable("plain text") == "plain text");
  CHECK(printable("a\nb\tc\rd\\e") == "a\\nb\\tc\\rd\\\\e");
  CHECK(printable(std::string("key\x87\x01\x7f", 6)) == "key\\x87\\x01\\x7f");
  CHECK(printable(std::string("nul\0x", 5)) == "nul\\x00x");
  CHECK(printable("pli\xc3\xa9 \xe2\x86\x92 \xf0\x9f\xa4\x96") == "pli\xc3\xa9 \xe2\x86\x92 \xf0\x9f\xa4\x96");  // é → 🤖
  CHECK(printable("\xc3") == "\\xc3");                  // truncated sequence
  CHECK(printable("\xc0\xaf") == "\\xc0\\xaf");         // overlong '/'
  CHECK(printable("\xed\xa0\x80") == "\\xed\\xa0\\x80");  // UTF-16 surrogate
}

TEST_CASE("append_utf8 writes each code point in its 1 to 4 byte form, and printable passes the result", "[unit][common]") {
  std::string s;
  for (char32_t cp : {U'A', U'\u00e9', U'\u20ac', U'\U0001F600', char32_t{0x7F}, char32_t{0x80}, char32_t{0x7FF},
                      char32_t{0x800}, char32_t{0xFFFF}, char32_t{0x10000}, char32_t{0x10FFFF}})
    append_utf8(s, cp);
  CHECK(s == "A\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\x7F\xC2\x80\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF"
             "\xF0\x90\x80\x80\xF4\x8F\xBF\xBF");
  CHECK(printable(s.substr(0, 10)) == s.substr(0, 10));  // well-formed: passes unchanged
}

TEST_CASE("quote_value quotes at most 200 characters and says how long the value was", "[unit][common][inputs]") {
  CHECK(quote_value("pick up") == "'pick up'");
  const std::string big(1 << 20, 'x');
  const std::string q = quote_value(big);
  CHECK(q == "'" + std::string(200, 'x') + "...' (1048576 bytes)");
  CHECK(quote_value(std::string(199, 'a') + "\xc3\xa9" + "zz").find("\\x") == std::string::npos);  // cut before é
  CHECK(quote_value("ab\x87", 10) == "'ab\\x87'");
}

TEST_CASE("warn_once: a repeated warning is logged once, then counted at powers of ten", "[unit][common][inputs]") {
  LogCapture log;
  for (int i = 0; i < 1000; ++i) warn_once("test: repeated", "test: bad \x87 byte\nand a line break");
  CHECK(warn_once_count("test: repeated") == 1000);
  CHECK(log.lines() == 4);  // the message, then 10, 100 and 1000 times
  CHECK_THAT(log.text(), Contains("test: bad \\x87 byte\\nand a line break (said once; repeats are counted)"));
  CHECK_THAT(log.text(), Contains("test: repeated: 1000 times so far"));
  CHECK(log.text().find('\x87') == std::string::npos);
}


TEST_CASE("every program's log lines: date, time to the second, level, message", "[unit][common]") {
  // What app::run_app installs for every program (pi0-train adds the rank of a multi-process run).
  auto format = [](const std::string& pattern, spdlog::level::level_enum level) {
    spdlog::pattern_formatter f(pattern);
    spdlog::details::log_msg msg("pi0", level, "hello");
    spdlog::memory_buf_t out;
    f.format(msg, out);
    return std::string(out.data(), out.size());
  };
  CHECK(std::regex_match(format(log_pattern(), spdlog::level::info),
                         std::regex(R"(\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] info hello\r?\n)")));
  CHECK(std::regex_match(format(log_pattern(3), spdlog::level::warn),
                         std::regex(R"(\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] \[rank 3\] warning hello\r?\n)")));
}

TEST_CASE("human_bytes and shortest_double: what log lines and config files show", "[unit][common]") {
  CHECK(human_bytes(0) == "0 B");
  CHECK(human_bytes(1023) == "1023 B");
  CHECK(human_bytes(1536) == "1.50 KiB");
  CHECK(human_bytes(12 * 1024 * 1024 + 300 * 1024) == "12.3 MiB");
  CHECK(human_bytes(int64_t{13979} << 20) == "13.7 GiB");
  CHECK(human_bytes(int64_t{300} << 30) == "300 GiB");
  CHECK(shortest_double(0.95) == "0.95");
  CHECK(shortest_double(2.5e-5) == "2.5e-05");
  CHECK(shortest_double(1.0) == "1.0");
  CHECK(shortest_double(-3.0) == "-3.0");
  CHECK(shortest_double(0.1 + 0.2) == "0.30000000000000004");  // exact: shortest, never rounded away
  for (double v : {0.95, 1e-8, 0.99, 2.5e-6, 1.0 / 3, 6.02214076e23})
    CHECK(std::stod(shortest_double(v)) == v);
}
