// The package's compiled module (inductor_xpugraph/native.py builds and finds it): three calls
// into torch's core that its Python API lacks outside CUDA builds (trees/invalidation.py).
#include <torch/extension.h>

// One tensor object loses its storage: any access raises `message`
// (what torch._C._set_storage_access_error_msg does on CUDA builds).
void invalidate_tensor(const at::Tensor& tensor, const std::string& message) {
  tensor.unsafeGetTensorImpl()->release_storage_and_set_meta_custom_data_ptr_error_msg_(message);
}

// A storage object loses its memory: any data access through any tensor over it raises
// `message` (torch._C._set_storage_data_ptr_access_error_msg on CUDA builds).
void invalidate_storage(int64_t storage_impl, const std::string& message) {
  reinterpret_cast<c10::StorageImpl*>(storage_impl)
      ->release_data_and_set_meta_custom_data_ptr_error_msg_(message);
}

// What UntypedStorage._swap_data_ptr_ does (torch 2.13 on): exchange the memory, and how it
// is allocated, of two storages of the same size on the same device.
void swap_storage_data(int64_t first_impl, int64_t second_impl) {
  auto* a = reinterpret_cast<c10::StorageImpl*>(first_impl);
  auto* b = reinterpret_cast<c10::StorageImpl*>(second_impl);
  TORCH_CHECK(a->nbytes() == b->nbytes() && a->device() == b->device(),
              "swap_storage_data: storages differ in size or device");
  at::DataPtr a_data = a->set_data_ptr(at::DataPtr(nullptr, a->device()));
  a->set_data_ptr(b->set_data_ptr(std::move(a_data)));
  at::Allocator* a_allocator = a->allocator();
  at::Allocator* b_allocator = b->allocator();
  bool a_resizable = a->resizable();
  bool b_resizable = b->resizable();
  a->set_resizable(false);
  b->set_resizable(false);
  a->set_allocator(b_allocator);
  b->set_allocator(a_allocator);
  a->set_resizable(b_resizable);
  b->set_resizable(a_resizable);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("invalidate_tensor", &invalidate_tensor);
  m.def("invalidate_storage", &invalidate_storage);
  m.def("swap_storage_data", &swap_storage_data);
}
