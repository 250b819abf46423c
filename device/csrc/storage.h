// Storage-level operations shared by the native ops and the hooks.
#pragma once

#include <c10/core/StorageImpl.h>

namespace saturn {

c10::DeviceIndex storage_device(const c10::StorageImpl* storage);
// Grows (or shrinks) a storage to `bytes`, keeping its leading contents.
void resize_storage_bytes(c10::StorageImpl* storage, size_t bytes);
// Copies raw bytes between any two of: host memory, saturn:0, saturn GPUs.
// A device index of -1 means host memory.
void copy_bytes(void* dst, c10::DeviceIndex dst_index, const void* src,
                c10::DeviceIndex src_index, size_t bytes);
// Exchanges the memory of two storages of one device and size: every tensor over either
// follows (how a compiled call's lent output gets memory of its own).
void swap_storage_data(c10::StorageImpl* a, c10::StorageImpl* b);

}  // namespace saturn
