#pragma once
// RFC 9110 / RFC 9112 syntax checks for what the boundary forwards. llhttp (as packaged) is
// lenient in places — e.g. it accepts "Name : value" — and a message the boundary forwards
// must mean the same thing to every parser downstream, so what is re-emitted is checked here.

#include <string_view>

namespace proto {

/// RFC 9110 §5.6.2 token: 1+ tchar ("!#$%&'*+-.^_`|~", DIGIT, ALPHA).
bool isToken(std::string_view text);

/// RFC 9110 §5.5 field value after llhttp trimmed the outer whitespace: visible ASCII, SP,
/// HTAB and obs-text (0x80-0xff); no other control character (no CR, LF, NUL).
bool isFieldValue(std::string_view text);

/// RFC 9112 §3.2 origin-form ("/path?query") or asterisk-form ("*"): no space, no control
/// character, no byte above 0x7e.
bool isOriginFormTarget(std::string_view text);

/// ASCII case-insensitive equality (field names, tokens: RFC 9110 §5.1).
bool equalsIgnoreCase(std::string_view a, std::string_view b);

/// True if `a` and `b` are the same field name, comparing letters case-insensitively and
/// '_' as '-' (CGI-style servers map both to one variable, RFC 3875 §4.1.18).
bool sameFieldName(std::string_view a, std::string_view b);

}  // namespace proto
