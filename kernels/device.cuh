// Whether a CUDA device can be used here, asked without aborting: on a machine
// with the toolkit but no driver or GPU, the answer is false and a reason.
#pragma once

#include <string>

namespace barata::cuda {

// True when at least one device is visible and the driver accepts this
// runtime. Otherwise false, and *why (when not null) says what was missing.
bool cuda_device_available(std::string* why);

}  // namespace barata::cuda
