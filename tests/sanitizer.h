// Whether the tests run under AddressSanitizer (shared by the test binaries).
#pragma once

namespace barata::test {

// Under AddressSanitizer every fiber switch of the emulation costs about 30
// times more: the emulated tests shorten their runs there.
inline bool sanitized() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return true;
#else
  return false;
#endif
#else
  return false;
#endif
}

}  // namespace barata::test
