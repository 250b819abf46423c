// The current saturn device of this thread, and the device guard PyTorch uses.
#pragma once

#include <c10/core/Device.h>

namespace saturn {

c10::DeviceIndex current_device();
// Checks the index, makes it current on this thread (and its GPU context current).
void set_current_device(c10::DeviceIndex index);
// An absent or negative index means the current device.
c10::DeviceIndex resolve(c10::DeviceIndex index);

}  // namespace saturn
