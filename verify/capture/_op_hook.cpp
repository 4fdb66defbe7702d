// The op capture's compiled hook (verify/capture/op_hook.py builds it against the torch it runs on): the ops the
// capture never records, and the detaches autograd makes of saved tensors while a dispatch mode is on, served in C++
// at the place torch hands them to the capture's Python handler, so that they cost ~1 us each instead of ~4-10.
//
// torch's Python-key fallback hands every op under a dispatch mode to `pyinterpreter()->dispatch(op, stack)` of the
// mode on top of the stack, and TensorImpl's shallow copies to `->detach(impl)`: virtual calls into the interpreter's
// vtable, which converts the stack to Python objects and calls `__torch_dispatch__`. Here that vtable is replaced by a
// copy whose `dispatch` and `detach` serve what the capture's handler would have passed through, while the capture's
// mode is on top, and hand everything else to the original: the same ops at the same key, run as the handler runs
// them (below autograd, with the capture's mode popped, so that the modes below still see them). The copy is made of
// the original's slots rather than written as a subclass: the interpreter's other methods change from one torch to
// the next (2.4's decref takes a second argument, 2.13 adds try_incref and refcnt), `dispatch` and `detach` do not, so
// one source builds against every torch (tests/perf/bench_op_hook.py is its probe).
#include <torch/extension.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/PyInterpreter.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {

using c10::impl::PyInterpreterVTable;
using c10::impl::TorchDispatchModeTLS;
using Dispatch = void (*)(const PyInterpreterVTable*, const c10::OperatorHandle&, torch::jit::Stack*);
using Detach = c10::intrusive_ptr<c10::TensorImpl> (*)(const PyInterpreterVTable*, const c10::TensorImpl*);

const PyInterpreterVTable* original = nullptr;  // torch's own vtable object
Dispatch original_dispatch = nullptr;
Detach original_detach = nullptr;
std::vector<void*> slots;         // the copy: offset to top, type info, then the virtual functions
void* patched_vptr = nullptr;     // a stateless vtable object is its vptr alone
PyObject* served_mode = nullptr;  // borrowed (the capture holds it while installed): the capture's mode object

PyObject* recorded = nullptr;     // the capture's `recorded(func, args, kwargs, out)`, called after a recorded op ran

// What the hook does with an op, by its schema's address (one per registered op, for the process's life): pass it
// through, or run it and hand it to `recorded`; the OpOverload is the one `recorded` gets (a strong reference, as
// torch keeps its own). Written from Python, read by every thread that dispatches (autograd's device threads among
// them) without the GIL. An op of neither kind goes to the Python handler.
std::unordered_set<const c10::FunctionSchema*> passed;
std::unordered_map<const c10::FunctionSchema*, std::pair<PyObject*, PyObject*>> recorded_ops;  // (func, its name)
std::shared_mutex ops_lock;
std::atomic<int64_t> passed_calls{0}, detaches{0}, recorded_calls{0};  // for the benches and tests

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

bool served_mode_on_top(int64_t depth) {
    return depth > 0 && TorchDispatchModeTLS::get_stack_at(depth - 1)->ptr(getPyInterpreter()) == served_mode;
}

enum class Served { by_python, passed, recorded };

Served served_as(const c10::OperatorHandle& op, std::pair<PyObject*, PyObject*>* func) {
    std::shared_lock<std::shared_mutex> reading(ops_lock);
    if (passed.count(&op.schema()))
        return Served::passed;
    auto found = recorded_ops.find(&op.schema());
    if (found == recorded_ops.end())
        return Served::by_python;
    *func = found->second;
    return Served::recorded;
}

// The op's returns as the handler's `func(*args, **kwargs)` returns them: None, the one value, or a tuple.
py::object returned(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
    const size_t count = op.schema().returns().size();
    std::vector<c10::IValue> returns(stack.end() - count, stack.end());
    return torch::jit::createPyObjectForStack(std::move(returns));
}

// The op's arguments as torch's Python-key fallback hands them to a mode's handler (torch's own
// parseIValuesToPyArgsKwargs, which libtorch_python does not export): positional ones up to the last that is not its
// default, keyword-only ones by name where they are not their default. Only ops without dtype, layout, memory format
// or generator arguments come here (_hand_over), whose values torch::jit::toPyObject gives as the handler gets them.
std::pair<py::tuple, py::dict> python_arguments(const c10::OperatorHandle& op,
                                               const std::vector<c10::IValue>& arguments) {
    const auto& schema = op.schema().arguments();
    auto is_default = [&](size_t index) {
        const auto& value = schema[index].default_value();
        return value.has_value() && *value == arguments[index];
    };
    size_t keyword_only = arguments.size();
    while (keyword_only > 0 && schema[keyword_only - 1].kwarg_only())
        --keyword_only;
    size_t positional = keyword_only;
    while (positional > 0 && is_default(positional - 1))
        --positional;
    py::tuple args(positional);
    for (size_t index = 0; index < positional; ++index)
        args[index] = torch::jit::toPyObject(arguments[index]);
    py::dict kwargs;
    for (size_t index = keyword_only; index < arguments.size(); ++index)
        if (!is_default(index))
            kwargs[py::str(schema[index].name())] = torch::jit::toPyObject(arguments[index]);
    return {std::move(args), std::move(kwargs)};
}

// A recorded op that writes none of its arguments: run here, then its arguments and outputs handed to `recorded`,
// which writes its records as the handler would have around its `func(*args, **kwargs)` (what it reads of them, the
// op left as they were), with the capture's mode still popped, as in the handler.
void run_and_hand_over(const c10::OperatorHandle& op, torch::jit::Stack* stack, std::pair<PyObject*, PyObject*> func) {
    const size_t count = op.schema().arguments().size();
    std::vector<c10::IValue> arguments(stack->end() - count, stack->end());
    op.callBoxed(stack);
    recorded_calls.fetch_add(1, std::memory_order_relaxed);
    py::gil_scoped_acquire gil;
    auto [args, kwargs] = python_arguments(op, arguments);
    py::object out = returned(op, *stack);
    const py::handle callback(recorded);
    callback(py::handle(func.first), py::handle(func.second), args, kwargs, out);
}

// What the handler's `func(*args, **kwargs)` does: the op runs with the capture's mode popped (the modes below see it
// as they would), then the mode is back, an exception or not.
void dispatch(const PyInterpreterVTable* self, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    std::pair<PyObject*, PyObject*> func;
    const Served how = served_mode_on_top(TorchDispatchModeTLS::stack_len()) ? served_as(op, &func) : Served::by_python;
    if (how == Served::by_python)
        return original_dispatch(original, op, stack);
    struct PushedBack {
        std::shared_ptr<c10::impl::PyObject_TorchDispatchMode> mode = TorchDispatchModeTLS::pop_stack();
        ~PushedBack() { TorchDispatchModeTLS::push_non_infra_mode_onto_stack(mode); }
    } popped;
    if (how == Served::recorded)
        return run_and_hand_over(op, stack, func);
    passed_calls.fetch_add(1, std::memory_order_relaxed);
    op.callBoxed(stack);
}

// No TensorImpl from the interpreter: TensorImpl makes its own shallow copy, as with no mode on. Only where the
// capture's mode is the only one (a mode below would have seen the detach) and the tensor is plain (a subclass's
// detach is its own __torch_dispatch__'s).
c10::intrusive_ptr<c10::TensorImpl> detach(const PyInterpreterVTable* self, const c10::TensorImpl* tensor) {
    if (TorchDispatchModeTLS::stack_len() != 1 || !served_mode_on_top(1) ||
        tensor->key_set().has(c10::DispatchKey::Python))
        return original_detach(original, tensor);
    detaches.fetch_add(1, std::memory_order_relaxed);
    return c10::intrusive_ptr<c10::TensorImpl>();
}

void forget_ops() {
    std::unique_lock<std::shared_mutex> writing(ops_lock);
    passed.clear();
    for (auto& [schema, func] : recorded_ops) {
        Py_DECREF(func.first);
        Py_DECREF(func.second);
    }
    recorded_ops.clear();
}

void install(py::object mode, py::object recorded_callback) {
    auto* interpreter = getPyInterpreter();
    if (original == nullptr) {
        original = interpreter->vtable_;
        void** vptr = *reinterpret_cast<void** const*>(original);
        const size_t count = slot_of(&PyInterpreterVTable::reset_backward_hooks) + 1;  // the last one declared
        slots.assign(vptr - 2, vptr + count);
        original_dispatch = reinterpret_cast<Dispatch>(vptr[slot_of(&PyInterpreterVTable::dispatch)]);
        original_detach = reinterpret_cast<Detach>(vptr[slot_of(&PyInterpreterVTable::detach)]);
        slots[2 + slot_of(&PyInterpreterVTable::dispatch)] = reinterpret_cast<void*>(&dispatch);
        slots[2 + slot_of(&PyInterpreterVTable::detach)] = reinterpret_cast<void*>(&detach);
        patched_vptr = slots.data() + 2;
    }
    TORCH_CHECK(served_mode == nullptr || served_mode == mode.ptr(), "the op hook serves one capture at a time");
    forget_ops();  // what one capture hands over depends on it (the ops its keyed streams serve)
    served_mode = mode.ptr();
    Py_XSETREF(recorded, recorded_callback.release().ptr());
    interpreter->vtable_ = reinterpret_cast<const PyInterpreterVTable*>(&patched_vptr);
}

void uninstall(py::object mode) {
    if (served_mode != mode.ptr())
        return;
    getPyInterpreter()->vtable_ = original;
    served_mode = nullptr;
    Py_CLEAR(recorded);
}

const c10::FunctionSchema* schema_of(py::handle func) {
    py::object schema = func.attr("_schema");
    const auto name = schema.attr("name").cast<std::string>();
    const auto overload = schema.attr("overload_name").cast<std::string>();
    auto op = c10::Dispatcher::singleton().findSchema({name, overload});
    TORCH_CHECK(op.has_value(), "no registered op ", name, ".", overload);
    return &op->schema();
}

void pass_through(py::object func) {
    const auto* schema = schema_of(func);
    std::unique_lock<std::shared_mutex> writing(ops_lock);
    passed.insert(schema);
}

void record_after(py::object func, py::str name) {
    const auto* schema = schema_of(func);
    std::unique_lock<std::shared_mutex> writing(ops_lock);
    if (recorded_ops.emplace(schema, std::make_pair(func.ptr(), name.ptr())).second) {
        func.inc_ref();
        name.inc_ref();
    }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("install", &install, "serve the passed ops and the detaches in C++ while this mode is on top of the stack");
    m.def("uninstall", &uninstall, "torch's own interpreter again, where this mode was the one served");
    m.def("pass_through", &pass_through, "this OpOverload is never recorded: pass it in C++");
    m.def("record_after", &record_after, "this OpOverload (recorded as `name`) writes none of its arguments: run it, then `recorded`");
    m.def("counts", [] { return py::make_tuple(passed_calls.load(), detaches.load(), recorded_calls.load()); },
          "(ops passed, detaches, ops run then recorded) so far");
}
