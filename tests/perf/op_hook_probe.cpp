// Issue 57's probe (tests/perf/bench_op_hook.py): the host cost of an op served in C++ at the place torch gives a
// Python dispatch mode, against the mode's Python handler.
//
// torch's Python-key fallback hands every op under a dispatch mode to `pyinterpreter()->dispatch(op, stack)` of the
// mode on top of the stack, and autograd's detaches of saved tensors to `->detach(impl)`: virtual calls into the
// interpreter's vtable, which converts the stack to Python arguments and calls `__torch_dispatch__`. Here that vtable
// is replaced by a copy whose `dispatch` and `detach` serve the ops in C++ while a given mode is on top, and hand
// everything else to the original. The ops are the Python handler's, at the same key, seen the same way: below
// autograd, with the mode popped while the op runs. The copy is made of the original's slots rather than written as a
// subclass: the interpreter's other methods change from one torch to the next (2.4's decref takes a second argument,
// 2.13 adds try_incref and refcnt), `dispatch` and `detach` do not, so one source builds against every torch.
#include <torch/extension.h>

#include <c10/core/impl/PyInterpreter.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/PyInterpreter.h>

#include <cstring>
#include <vector>

namespace {

using c10::impl::PyInterpreterVTable;
using c10::impl::TorchDispatchModeTLS;
using Dispatch = void (*)(const PyInterpreterVTable*, const c10::OperatorHandle&, torch::jit::Stack*);
using Detach = c10::intrusive_ptr<c10::TensorImpl> (*)(const PyInterpreterVTable*, const c10::TensorImpl*);

const PyInterpreterVTable* original = nullptr;  // torch's own vtable object
Dispatch original_dispatch = nullptr;
Detach original_detach = nullptr;
std::vector<void*> slots;        // the copy: offset to top, type info, then the virtual functions
void* patched_vptr = nullptr;    // a stateless vtable object is its vptr alone
PyObject* served_mode = nullptr; // borrowed: the Python mode object whose ops are served here
int64_t served = 0;

// The slot of a virtual member function in the Itanium C++ ABI: an odd offset into the vtable, or on ARM the offset
// with the virtual flag in the adjustment.
template <class Member>
size_t slot_of(Member member) {
    struct {
        uintptr_t ptr;
        ptrdiff_t adjustment;
    } raw;
    static_assert(sizeof(raw) == sizeof(member), "an Itanium ABI member pointer");
    std::memcpy(&raw, &member, sizeof(raw));
#if defined(__arm__) || defined(__aarch64__)
    return raw.ptr / sizeof(void*);
#else
    return (raw.ptr - 1) / sizeof(void*);
#endif
}

bool served_mode_on_top() {
    const auto depth = TorchDispatchModeTLS::stack_len();
    return depth > 0 && TorchDispatchModeTLS::get_stack_at(depth - 1)->ptr(getPyInterpreter()) == served_mode;
}

// What an empty mode's `func(*args, **kwargs)` does: the op runs with the mode popped, then the mode is back.
void serve(const PyInterpreterVTable* self, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    if (!served_mode_on_top())
        return original_dispatch(original, op, stack);
    struct PushedBack {
        std::shared_ptr<c10::impl::PyObject_TorchDispatchMode> mode = TorchDispatchModeTLS::pop_stack();
        ~PushedBack() { TorchDispatchModeTLS::push_non_infra_mode_onto_stack(mode); }
    } popped;
    ++served;
    op.callBoxed(stack);
}

// No TensorImpl from the interpreter: TensorImpl makes its own shallow copy, as with no mode on.
c10::intrusive_ptr<c10::TensorImpl> detach(const PyInterpreterVTable* self, const c10::TensorImpl* tensor) {
    return served_mode_on_top() ? c10::intrusive_ptr<c10::TensorImpl>() : original_detach(original, tensor);
}

void install(py::object mode) {
    auto* interpreter = getPyInterpreter();
    if (original == nullptr) {
        original = interpreter->vtable_;
        void** vptr = *reinterpret_cast<void** const*>(original);
        const size_t count = slot_of(&PyInterpreterVTable::reset_backward_hooks) + 1;  // the last one declared
        slots.assign(vptr - 2, vptr + count);
        original_dispatch = reinterpret_cast<Dispatch>(vptr[slot_of(&PyInterpreterVTable::dispatch)]);
        original_detach = reinterpret_cast<Detach>(vptr[slot_of(&PyInterpreterVTable::detach)]);
        slots[2 + slot_of(&PyInterpreterVTable::dispatch)] = reinterpret_cast<void*>(&serve);
        slots[2 + slot_of(&PyInterpreterVTable::detach)] = reinterpret_cast<void*>(&detach);
        patched_vptr = slots.data() + 2;
    }
    served_mode = mode.ptr();
    interpreter->vtable_ = reinterpret_cast<const PyInterpreterVTable*>(&patched_vptr);
}

void uninstall() {
    getPyInterpreter()->vtable_ = original;
    served_mode = nullptr;
}

int64_t served_ops() { return served; }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("install", &install, "serve the ops of this mode in C++ while it is on top of the dispatch mode stack");
    m.def("uninstall", &uninstall, "torch's own interpreter again");
    m.def("served_ops", &served_ops, "ops served in C++ so far");
}
