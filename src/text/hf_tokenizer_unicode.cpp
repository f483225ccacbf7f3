// hf_tokenizer_unicode.cpp: the Unicode normalization forms of the native tokenizer's normalizers
// (tokenizer.json types NFC, NFD, NFKC, NFKD) through utf8proc (libutf8proc-dev). Built only when
// CMake finds utf8proc; without it parse_normalizer refuses those types. Contract:
// hf_tokenizer_pipeline.h.
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include <utf8proc.h>

#include "runtime/error.h"
#include "text/hf_tokenizer_pipeline.h"

namespace qshard::hf_tok {

std::string unicode_normalize(std::string_view s, NormalForm f) {
  bool ascii = true;
  for (unsigned char c : s) ascii = ascii && c < 0x80;
  if (ascii) return std::string(s);  // every form leaves ASCII as it is
  // UTF8PROC_STABLE: Unicode's stable normalization (no composition excluded by the standard is
  // made); utf8proc_NFC and friends are these flags with NUL termination, which would cut the text
  // at a NUL byte, so utf8proc_map is called with the length instead.
  int options = UTF8PROC_STABLE;
  switch (f) {
    case NormalForm::kNfc: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNfd: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::kNfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::kNfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &out,
                                          static_cast<utf8proc_option_t>(options));
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(out, &std::free);
  if (n < 0)  // only for invalid UTF-8 (which encode has replaced) or out of memory
    throw InputError(std::string("Unicode normalization (utf8proc): ") + utf8proc_errmsg(n));
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

std::string unicode_normalizer_version() { return utf8proc_unicode_version(); }

}  // namespace qshard::hf_tok
