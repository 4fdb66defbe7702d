// The op capture's compiled hook (verify/capture/op_hook.py builds it against the torch it runs on): what the capture's
// Python handler would do with most ops, done in C++ at the place torch hands them to it, so that they skip torch's
// Python plumbing (~4-10 us an op on the host, on the critical path of an accelerator's step):
// - the ops the capture never records (views, bookkeeping), and those the keyed random streams' mode does not draw
//   for (verify/capture/random_streams.py: the optimizer's step, with the capture paused, sees only that mode), are
//   passed to torch;
// - the detaches autograd makes of saved tensors while a mode is on are left to TensorImpl, as with no mode;
// - a recorded op that writes none of its arguments runs here, then its arguments and outputs go to the capture's
//   Python `recorded`, which writes its records as the handler would have around its `func(*args, **kwargs)`.
// Each mode tells the hook which ops are which from their first call, which its Python handler sees.
//
// torch's Python-key fallback hands every op under a dispatch mode to `pyinterpreter()->dispatch(op, stack)` of the
// mode on top of the stack, and TensorImpl's shallow copies to `->detach(impl)`: virtual calls into the interpreter's
// vtable, which converts the stack to Python objects and calls `__torch_dispatch__`. Here that vtable is replaced by a
// copy whose `dispatch` and `detach` serve what a served mode hands over while it is on top, and give everything else
// to the original: the same ops at the same key, run as the handler runs them (below autograd, with the mode popped,
// so that the modes below still see them). The copy is made of the original's slots rather than written as a
// subclass: the interpreter's other methods change from one torch to the next (2.4's decref takes a second argument,
// 2.13 adds try_incref and refcnt), `dispatch` and `detach` do not, so one source builds against every torch
// (tests/perf/bench_op_hook.py measured the probe it grew from).
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

// A mode served here: the ops it passes through, those it records after they ran (with the OpOverload and the name
// its `recorded(func, name, args, kwargs, out)` gets), by their schema's address (one per registered op, for the
// process's life). An op of neither kind goes to the mode's Python handler.
struct ServedMode {
    py::object mode;               // held until `unserve`: its address is never another object's meanwhile
    py::object recorded;           // None for a mode that records nothing
    std::unordered_set<const c10::FunctionSchema*> passed;
    std::unordered_map<const c10::FunctionSchema*, std::pair<py::object, py::object>> recorded_ops;
};
// A few (the capture's recorder, the keyed streams' mode), written from Python, read by every thread that dispatches
// (autograd's device threads among them) without the GIL.
// Never destroyed: a mode still served when the process exits must not be released after Python is gone.
std::vector<std::unique_ptr<ServedMode>>& served_modes = *new std::vector<std::unique_ptr<ServedMode>>;
std::shared_mutex served_lock;
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

PyObject* top_mode(int64_t depth) {
    return depth > 0 ? TorchDispatchModeTLS::get_stack_at(depth - 1)->ptr(getPyInterpreter()) : nullptr;
}

ServedMode* served(PyObject* mode) {  // under served_lock
    for (auto& candidate : served_modes)
        if (candidate->mode.ptr() == mode)
            return candidate.get();
    return nullptr;
}

enum class Served { by_python, passed, recorded };

// What the mode on top does with the op; for one it records, the OpOverload and name its `recorded` gets.
Served served_as(const c10::OperatorHandle& op, std::tuple<PyObject*, PyObject*, PyObject*>* recording) {
    PyObject* mode = top_mode(TorchDispatchModeTLS::stack_len());
    if (mode == nullptr)
        return Served::by_python;
    std::shared_lock<std::shared_mutex> reading(served_lock);
    ServedMode* on_top = served(mode);
    if (on_top == nullptr)
        return Served::by_python;
    if (on_top->passed.count(&op.schema()))
        return Served::passed;
    auto found = on_top->recorded_ops.find(&op.schema());
    if (found == on_top->recorded_ops.end())
        return Served::by_python;
    *recording = {on_top->recorded.ptr(), found->second.first.ptr(), found->second.second.ptr()};
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
void run_and_hand_over(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                       std::tuple<PyObject*, PyObject*, PyObject*> recording) {
    const size_t count = op.schema().arguments().size();
    std::vector<c10::IValue> arguments(stack->end() - count, stack->end());
    op.callBoxed(stack);
    recorded_calls.fetch_add(1, std::memory_order_relaxed);
    py::gil_scoped_acquire gil;
    auto [args, kwargs] = python_arguments(op, arguments);
    py::object out = returned(op, *stack);
    const auto [recorded, func, name] = recording;
    const py::handle callback(recorded);
    callback(py::handle(func), py::handle(name), args, kwargs, out);
}

// What the handler's `func(*args, **kwargs)` does: the op runs with the capture's mode popped (the modes below see it
// as they would), then the mode is back, an exception or not.
void dispatch(const PyInterpreterVTable* self, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    std::tuple<PyObject*, PyObject*, PyObject*> recording;
    const Served how = served_as(op, &recording);
    if (how == Served::by_python)
        return original_dispatch(original, op, stack);
    struct PushedBack {
        std::shared_ptr<c10::impl::PyObject_TorchDispatchMode> mode = TorchDispatchModeTLS::pop_stack();
        ~PushedBack() { TorchDispatchModeTLS::push_non_infra_mode_onto_stack(mode); }
    } popped;
    if (how == Served::recorded)
        return run_and_hand_over(op, stack, recording);
    passed_calls.fetch_add(1, std::memory_order_relaxed);
    op.callBoxed(stack);
}

// No TensorImpl from the interpreter: TensorImpl makes its own shallow copy, as with no mode on. Only where a served
// mode is the only one (a mode below would have seen the detach) and the tensor is plain (a subclass's detach is its
// own __torch_dispatch__'s).
c10::intrusive_ptr<c10::TensorImpl> detach(const PyInterpreterVTable* self, const c10::TensorImpl* tensor) {
    bool served_alone = false;
    if (TorchDispatchModeTLS::stack_len() == 1 && !tensor->key_set().has(c10::DispatchKey::Python)) {
        std::shared_lock<std::shared_mutex> reading(served_lock);
        served_alone = served(top_mode(1)) != nullptr;
    }
    if (!served_alone)
        return original_detach(original, tensor);
    detaches.fetch_add(1, std::memory_order_relaxed);
    return c10::intrusive_ptr<c10::TensorImpl>();
}

void install_vtable() {
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
    interpreter->vtable_ = reinterpret_cast<const PyInterpreterVTable*>(&patched_vptr);
}

// Serves `mode` from now on, with no op handed over yet: what a mode hands over depends on it (a capture's on the
// ops its keyed streams serve).
void serve(py::object mode, py::object recorded) {
    std::unique_lock<std::shared_mutex> writing(served_lock);
    TORCH_CHECK(served(mode.ptr()) == nullptr, "this mode is served already");
    served_modes.push_back(std::make_unique<ServedMode>(ServedMode{mode, std::move(recorded), {}, {}}));
    install_vtable();
}

void unserve(py::object mode) {
    std::unique_ptr<ServedMode> leaving;  // released after the lock: its references' decrefs run no code under it
    {
        std::unique_lock<std::shared_mutex> writing(served_lock);
        for (auto it = served_modes.begin(); it != served_modes.end(); ++it)
            if ((*it)->mode.ptr() == mode.ptr()) {
                leaving = std::move(*it);
                served_modes.erase(it);
                break;
            }
        if (served_modes.empty() && original != nullptr)
            getPyInterpreter()->vtable_ = original;
    }
}

const c10::FunctionSchema* schema_of(py::handle func) {
    py::object schema = func.attr("_schema");
    const auto name = schema.attr("name").cast<std::string>();
    const auto overload = schema.attr("overload_name").cast<std::string>();
    auto op = c10::Dispatcher::singleton().findSchema({name, overload});
    TORCH_CHECK(op.has_value(), "no registered op ", name, ".", overload);
    return &op->schema();
}

void pass_through(py::object mode, py::object func) {
    const auto* schema = schema_of(func);
    std::unique_lock<std::shared_mutex> writing(served_lock);
    ServedMode* serving = served(mode.ptr());
    TORCH_CHECK(serving != nullptr, "this mode is not served");
    serving->passed.insert(schema);
}

void record_after(py::object mode, py::object func, py::str name) {
    const auto* schema = schema_of(func);
    std::unique_lock<std::shared_mutex> writing(served_lock);
    ServedMode* serving = served(mode.ptr());
    TORCH_CHECK(serving != nullptr && !serving->recorded.is_none(), "this mode records nothing here");
    serving->recorded_ops.emplace(schema, std::make_pair(func, name));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("serve", &serve, py::arg("mode"), py::arg("recorded") = py::none(),
          "serve the ops this mode hands over, and the detaches, in C++ while it is on top of the stack");
    m.def("unserve", &unserve, "this mode's ops go to its Python handler again; torch's own vtable once none is left");
    m.def("pass_through", &pass_through, "this mode never acts on this OpOverload: pass it in C++");
    m.def("record_after", &record_after,
          "this OpOverload (recorded as `name`) writes none of its arguments: run it in C++, then the mode's `recorded`");
    m.def("counts", [] { return py::make_tuple(passed_calls.load(), detaches.load(), recorded_calls.load()); },
          "(ops passed, detaches, ops run then recorded) so far");
}
