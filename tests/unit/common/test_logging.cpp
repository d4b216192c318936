// Log hygiene (issue 11): repeated warnings said once then counted, values quoted short, raw bytes escaped.
#include <catch2/catch.hpp>

#include "pi0/common/log_line.h"
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

