// Small string helpers shared by every user-facing validation (config keys, presets, precision modes).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pi0 {

/// Levenshtein distance (insertions, deletions, substitutions).
size_t edit_distance(const std::string& a, const std::string& b);

/// The candidate closest to `value` if it is a plausible typo of it (at most a third of the longer string
/// changed, at least 2 edits allowed), else "".
std::string did_you_mean(const std::string& value, const std::vector<std::string>& candidates);

/// `text` with control characters and bytes that are not well-formed UTF-8 written as escapes (\n, \t, \r, \\,
/// else \xNN), so a value read from a file (a key, a prompt, a header) cannot put raw bytes or line breaks into a
/// one-line message. Printable ASCII and well-formed UTF-8 (a prompt in French) pass unchanged.
std::string printable(std::string_view text);

/// `value` for quoting in a message: printable() of at most `max_chars` of it, in single quotes; a longer value
/// is cut and says how long it was, e.g. 'pick up the ...' (1048576 bytes). Keeps a 1 MB prompt out of a log line.
std::string quote_value(std::string_view value, size_t max_chars = 200);

/// A byte count for people, 3 significant digits in binary units: "512 B", "1.50 KiB", "12.3 MiB", "13.0 GiB".
std::string human_bytes(int64_t bytes);

/// The shortest decimal text that reads back as exactly `value` (0.95, not 0.94999999999999996; 1e-08), with
/// ".0" on integral values so it still reads as a number with a fraction ("1.0"); "inf", "-inf", "nan" otherwise.
std::string shortest_double(double value);

/// Appends the UTF-8 encoding of code point `cp` (at most U+10FFFF; callers reject surrogates and larger values
/// first, as their messages name their own input).
void append_utf8(std::string& out, char32_t cp);

}  // namespace pi0
