// The default random generator of each saturn device (seeding, state).
#pragma once

#include <ATen/core/Generator.h>

namespace saturn {

const at::Generator& default_generator(c10::DeviceIndex index);

}  // namespace saturn
