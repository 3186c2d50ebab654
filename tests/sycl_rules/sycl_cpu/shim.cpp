// A header-free bridge from Python (ctypes) to the graph API of Intel's SYCL runtime.
//
// dpctl gives queues, USM memory and kernels, but no sycl_ext_oneapi_graph calls, and it turns
// every sycl::exception into a generic Python error. The functions below call the exported C++
// symbols of libsycl.so.9 by their Itanium-mangled names (nm -D --defined-only libsycl.so.9) and
// return SYCL's own exception text (e.what()) through shim_error().
//
// It depends on the binary layout of one release; pinned: intel-sycl-rt==2026.2.0 (libsycl.so.9.0.0),
// intel-opencl-rt==2026.2.0, dpctl==0.22.1, built with g++ against the system libstdc++.
// Layout assumptions, all from that release's headers:
//   - sycl::queue, sycl::device, sycl::event, modifiable_command_graph and executable_command_graph
//     each hold exactly one std::shared_ptr to their implementation (16 bytes);
//   - dpctl's DPCTLSycl{Queue,Device,Event}Ref are pointers to heap sycl::queue/device/event objects
//     (DPCTLEvent_Copy does `new sycl::event(*ref)`, DPCTLEvent_Delete does `delete ref`);
//   - an all-zero sycl::property_list is the empty one (a zero bitset and empty std::vectors);
//   - sycl::detail::code_location is {const char*, const char*, unsigned long, unsigned long}.
//
// Build: g++ -O1 -shared -fPIC -std=c++17 shim.cpp -o libshim.so -ldl  (real_runtime.py does it).
#include <dlfcn.h>

#include <cstddef>
#include <cstdio>
#include <exception>
#include <memory>
#include <vector>

namespace {

// 16 opaque bytes: the layout of every SYCL handle type used here (one std::shared_ptr).
struct alignas(8) Handle {
  void* words[2];
};
static_assert(sizeof(Handle) == sizeof(std::shared_ptr<void>), "SYCL handles are one shared_ptr");

struct CodeLocation {
  const char* file;
  const char* function;
  unsigned long line;
  unsigned long column;
};

struct Span {  // sycl::span<const sycl::event>, passed by value
  const Handle* data;
  std::size_t size;
};

const CodeLocation kLocation{"shim.cpp", "inductor_xpugraph_sycl_cpu_shim", 0, 0};
alignas(16) const unsigned char kEmptyPropertyList[128] = {};

char g_error[8192];

// The resolved entry points. Member functions take `this` first; functions returning a SYCL
// object (event, executable graph) take the address of the result before everything else.
struct Api {
  void (*graph_construct)(Handle* self, const Handle* queue, const void* props);
  void (*begin_recording)(Handle* self, Handle* queue, const void* props);
  void (*end_recording_all)(Handle* self);
  void (*end_recording_queue)(Handle* self, Handle* queue);
  void (*finalize)(Handle* result, const Handle* self, const void* props);
  void (*submit_graph)(Handle* result, const Handle* queue, Handle* exec, Span deps,
                       const CodeLocation*);
  void (*queue_wait)(Handle* self, const CodeLocation*);
  int (*queue_state)(const Handle* self);
  void (*barrier_all)(Handle* result, Handle* self, const CodeLocation*);
  void (*barrier_events)(Handle* result, Handle* self, const std::vector<Handle>* events,
                         const CodeLocation*);
  void (*event_wait)(Handle* self);
  int (*event_status)(const Handle* self);
  void (*device_wait)(Handle* self);
};
Api g_api;

struct Symbol {
  void** slot;
  const char* name;
};

const Symbol kSymbols[] = {
    {(void**)&g_api.graph_construct,
     "_ZN4sycl3_V13ext6oneapi12experimental6detail24modifiable_command_graphC1ERKNS0_5queueERKNS0_"
     "13property_listE"},
    {(void**)&g_api.begin_recording,
     "_ZN4sycl3_V13ext6oneapi12experimental6detail24modifiable_command_graph15begin_recordingERNS0_"
     "5queueERKNS0_13property_listE"},
    {(void**)&g_api.end_recording_all,
     "_ZN4sycl3_V13ext6oneapi12experimental6detail24modifiable_command_graph13end_recordingEv"},
    {(void**)&g_api.end_recording_queue,
     "_ZN4sycl3_V13ext6oneapi12experimental6detail24modifiable_command_graph13end_recordingERNS0_"
     "5queueE"},
    {(void**)&g_api.finalize,
     "_ZNK4sycl3_V13ext6oneapi12experimental6detail24modifiable_command_graph8finalizeERKNS0_13prop"
     "erty_listE"},
    {(void**)&g_api.submit_graph,
     "_ZN4sycl3_V135submit_graph_direct_with_event_implERKNS0_5queueERNS0_3ext6oneapi12experimenta"
     "l13command_graphILNS6_11graph_stateE1EEENS0_4spanIKNS0_5eventELm18446744073709551615EEERKNS0_"
     "6detail13code_locationE"},
    {(void**)&g_api.queue_wait, "_ZN4sycl3_V15queue10wait_proxyERKNS0_6detail13code_locationE"},
    {(void**)&g_api.queue_state, "_ZNK4sycl3_V15queue20ext_oneapi_get_stateEv"},
    {(void**)&g_api.barrier_all,
     "_ZN4sycl3_V15queue25ext_oneapi_submit_barrierERKNS0_6detail13code_locationE"},
    {(void**)&g_api.barrier_events,
     "_ZN4sycl3_V15queue25ext_oneapi_submit_barrierERKSt6vectorINS0_5eventESaIS3_EERKNS0_6detail13c"
     "ode_locationE"},
    {(void**)&g_api.event_wait, "_ZN4sycl3_V15event4waitEv"},
    {(void**)&g_api.event_status,
     "_ZNK4sycl3_V15event8get_infoINS0_4info5event24command_execution_statusEEENS0_6detail18is_even"
     "t_info_descIT_E11return_typeEv"},
    {(void**)&g_api.device_wait, "_ZN4sycl3_V16device15ext_oneapi_waitEv"},
};

// Drops one reference of a SYCL handle and frees its storage. The library exports no destructors
// (they are inline in the headers); the control block is polymorphic, so releasing it through
// shared_ptr<void> runs the real implementation's destructor when this was the last reference.
void destroy(Handle* handle) {
  reinterpret_cast<std::shared_ptr<void>*>(handle)->~shared_ptr();
  delete handle;
}

}  // namespace

// Each call returns 0 on success, 1 when SYCL threw (the text is in shim_error()), 2 for anything
// that is not a std::exception.
#define SHIM_TRY    \
  g_error[0] = 0;   \
  try {
#define SHIM_CATCH                                              \
  }                                                             \
  catch (const std::exception& error) {                         \
    std::snprintf(g_error, sizeof g_error, "%s", error.what()); \
    return 1;                                                   \
  }                                                             \
  catch (...) {                                                 \
    std::snprintf(g_error, sizeof g_error, "unknown C++ exception"); \
    return 2;                                                   \
  }                                                             \
  return 0;

extern "C" {

const char* shim_error() { return g_error; }

// Resolves every symbol in the already loaded libsycl (path: its file). Returns 0, or 1 with the
// missing symbol's name in shim_error().
int shim_init(const char* libsycl_path) {
  void* library = dlopen(libsycl_path, RTLD_NOW | RTLD_GLOBAL);
  if (!library) {
    std::snprintf(g_error, sizeof g_error, "dlopen: %s", dlerror());
    return 1;
  }
  for (const Symbol& symbol : kSymbols) {
    *symbol.slot = dlsym(library, symbol.name);
    if (!*symbol.slot) {
      std::snprintf(g_error, sizeof g_error, "libsycl lacks %s", symbol.name);
      return 1;
    }
  }
  return 0;
}

// sycl::ext::oneapi::experimental::command_graph<modifiable>(queue.get_context(), queue.get_device())
int shim_graph_new(const Handle* queue, Handle** out) {
  SHIM_TRY
  auto graph = std::make_unique<Handle>();
  g_api.graph_construct(graph.get(), queue, kEmptyPropertyList);
  *out = graph.release();
  SHIM_CATCH
}

// Destroys one modifiable or executable graph handle (or an event made here).
void shim_handle_destroy(Handle* handle) { destroy(handle); }

int shim_graph_begin_recording(Handle* graph, Handle* queue) {
  SHIM_TRY
  g_api.begin_recording(graph, queue, kEmptyPropertyList);
  SHIM_CATCH
}

// queue == NULL: the overload without arguments (every queue recording to this graph).
int shim_graph_end_recording(Handle* graph, Handle* queue) {
  SHIM_TRY
  if (queue)
    g_api.end_recording_queue(graph, queue);
  else
    g_api.end_recording_all(graph);
  SHIM_CATCH
}

int shim_graph_finalize(const Handle* graph, Handle** out) {
  SHIM_TRY
  auto exec = std::make_unique<Handle>();
  g_api.finalize(exec.get(), graph, kEmptyPropertyList);
  *out = exec.release();
  SHIM_CATCH
}

// queue.ext_oneapi_graph(exec); *out: a new sycl::event, to hand to dpctl and then destroy.
int shim_queue_submit_graph(const Handle* queue, Handle* exec, Handle** out) {
  SHIM_TRY
  auto event = std::make_unique<Handle>();
  g_api.submit_graph(event.get(), queue, exec, Span{nullptr, 0}, &kLocation);
  *out = event.release();
  SHIM_CATCH
}

// queue.ext_oneapi_submit_barrier(events), or the overload without a list when count == 0.
int shim_queue_submit_barrier(Handle* queue, const Handle* const* events, std::size_t count,
                              Handle** out) {
  SHIM_TRY
  auto event = std::make_unique<Handle>();
  if (count == 0) {
    g_api.barrier_all(event.get(), queue, &kLocation);
  } else {
    // Bitwise copies that take no reference: the callee reads the list through a const
    // reference, and Handle's trivial destructor leaves the counts alone.
    std::vector<Handle> list;
    for (std::size_t i = 0; i < count; ++i) list.push_back(*events[i]);
    g_api.barrier_events(event.get(), queue, &list, &kLocation);
  }
  *out = event.release();
  SHIM_CATCH
}

int shim_queue_wait(Handle* queue) {
  SHIM_TRY
  g_api.queue_wait(queue, &kLocation);
  SHIM_CATCH
}

// queue.ext_oneapi_get_state(): 0 executing, 1 recording.
int shim_queue_state(const Handle* queue, int* out) {
  SHIM_TRY
  *out = g_api.queue_state(queue);
  SHIM_CATCH
}

int shim_event_wait(Handle* event) {
  SHIM_TRY
  g_api.event_wait(event);
  SHIM_CATCH
}

// event.get_info<info::event::command_execution_status>(): 0 complete, 1 running, 2 submitted.
int shim_event_status(const Handle* event, int* out) {
  SHIM_TRY
  *out = g_api.event_status(event);
  SHIM_CATCH
}

int shim_device_wait(Handle* device) {
  SHIM_TRY
  g_api.device_wait(device);
  SHIM_CATCH
}

}  // extern "C"
