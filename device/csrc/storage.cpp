#include "storage.h"

#include "driver.h"
#include "guard.h"

#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

namespace saturn {

c10::DeviceIndex storage_device(const c10::StorageImpl* storage) {
  return storage->device().index();
}

void swap_storage_data(c10::StorageImpl* a, c10::StorageImpl* b) {
  TORCH_CHECK(a->device() == b->device(), "saturn: swap_storage_data across devices (",
              a->device(), ", ", b->device(), ")");
  TORCH_CHECK(a->nbytes() == b->nbytes(), "saturn: swap_storage_data of ", a->nbytes(),
              " and ", b->nbytes(), " bytes");
  at::DataPtr was_a = a->set_data_ptr(std::move(b->mutable_data_ptr()));
  b->set_data_ptr_noswap(std::move(was_a));
}

void copy_bytes(void* dst, c10::DeviceIndex dst_index, const void* src,
                c10::DeviceIndex src_index, size_t bytes) {
  if (bytes == 0) return;
  const bool dst_gpu = is_gpu(dst_index);
  const bool src_gpu = is_gpu(src_index);
  auto d = reinterpret_cast<CUdeviceptr>(dst);
  auto s = reinterpret_cast<CUdeviceptr>(src);
  if (!dst_gpu && !src_gpu) {
    std::memcpy(dst, src, bytes);
  } else if (dst_gpu && !src_gpu) {
    copy_h2d(dst_index, d, src, bytes);
  } else if (!dst_gpu && src_gpu) {
    copy_d2h(src_index, dst, s, bytes);
  } else if (dst_index == src_index) {
    copy_d2d(dst_index, d, s, bytes);
  } else {
    copy_peer(dst_index, d, src_index, s, bytes);
  }
}

void resize_storage_bytes(c10::StorageImpl* storage, size_t bytes) {
  if (bytes == storage->nbytes()) return;
  TORCH_CHECK(storage->resizable(), "saturn: trying to resize a storage that is not resizable");
  const c10::DeviceIndex index = storage_device(storage);
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, index));
  c10::DataPtr fresh = storage->allocator()->allocate(bytes);
  const size_t keep = std::min(bytes, storage->nbytes());
  if (keep > 0) copy_bytes(fresh.get(), index, storage->data(), index, keep);
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(bytes);
}

}  // namespace saturn
