/* The op capture's __torch_dispatch__ entry in C (verify/capture/ops.py, _OpRecorder): torch calls a dispatch mode's
 * handler for every aten op, and more than half of a training step's ops are views and bookkeeping that the capture
 * never records (t, view, detach, ...). Those go straight to the op here, with no Python frame, no dynamo guard and no
 * hash of an OpOverload (whose __hash__ is Python code): one pointer lookup. Every other op goes to the mode's Python
 * handler, which records it, or adds the op to the table once it knows the op is never recorded.
 *
 * Optional, as _stats.c is: where it is not built, the Python handler sees every op, with the same records.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *mode;        /* the mode: torch checks that its handler's __self__ is the mode */
    PyObject *handler;     /* the mode's Python handler, bound */
    PyObject *passed;      /* dict: id(OpOverload) -> (the OpOverload, its C++ op) of the ops passed through */
} Entry;

static PyObject *entry_call(PyObject *self, PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
    Entry *entry = (Entry *)self;
    Py_ssize_t count = PyVectorcall_NARGS(nargsf);
    if (count >= 3 && kwnames == NULL && PyTuple_Check(argv[2])) {
        PyObject *key = PyLong_FromVoidPtr(argv[0]);
        if (key == NULL)
            return NULL;
        PyObject *passed = PyDict_GetItemWithError(entry->passed, key); /* borrowed */
        Py_DECREF(key);
        if (passed != NULL) {
            PyObject *kwargs = count > 3 && PyDict_Check(argv[3]) && PyDict_GET_SIZE(argv[3]) ? argv[3] : NULL;
            return PyObject_Call(PyTuple_GET_ITEM(passed, 1), argv[2], kwargs);
        }
        if (PyErr_Occurred())
            return NULL;
    }
    return PyObject_Vectorcall(entry->handler, argv, nargsf, kwnames);
}

static PyObject *entry_pass(PyObject *self, PyObject *func) {
    /* pass(func): `func` is never recorded; from now on it goes straight to its C++ op */
    Entry *entry = (Entry *)self;
    PyObject *op = PyObject_GetAttrString(func, "_op");
    if (op == NULL)
        return NULL;
    PyObject *key = PyLong_FromVoidPtr(func);
    PyObject *value = key == NULL ? NULL : PyTuple_Pack(2, func, op);
    int failed = value == NULL || PyDict_SetItem(entry->passed, key, value) < 0;
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_DECREF(op);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *entry_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *mode, *handler;
    if (!PyArg_ParseTuple(args, "OO:Entry", &mode, &handler))
        return NULL;
    Entry *entry = (Entry *)type->tp_alloc(type, 0);
    if (entry == NULL)
        return NULL;
    entry->vectorcall = entry_call;
    entry->passed = PyDict_New();
    if (entry->passed == NULL) {
        Py_DECREF(entry);
        return NULL;
    }
    Py_INCREF(mode);
    Py_INCREF(handler);
    entry->mode = mode;
    entry->handler = handler;
    return (PyObject *)entry;
}

static int entry_traverse(Entry *entry, visitproc visit, void *arg) {
    Py_VISIT(entry->mode);
    Py_VISIT(entry->handler);
    Py_VISIT(entry->passed);
    return 0;
}

static int entry_clear(Entry *entry) {
    Py_CLEAR(entry->mode);
    Py_CLEAR(entry->handler);
    Py_CLEAR(entry->passed);
    return 0;
}

static void entry_dealloc(Entry *entry) {
    PyObject_GC_UnTrack(entry);
    entry_clear(entry);
    Py_TYPE(entry)->tp_free((PyObject *)entry);
}

static PyMemberDef entry_members[] = {
    {"__self__", T_OBJECT, offsetof(Entry, mode), READONLY, "the mode this entry dispatches for"},
    {"passed", T_OBJECT, offsetof(Entry, passed), READONLY, "id(OpOverload) -> (OpOverload, op), ops passed"},
    {NULL},
};

static PyMethodDef entry_methods[] = {
    {"pass_through", entry_pass, METH_O, "pass_through(func): never recorded, `func` goes straight to its op"},
    {NULL},
};

static PyTypeObject EntryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "verify.capture._dispatch.Entry",
    .tp_doc = "Entry(mode, handler): a dispatch mode's __torch_dispatch__, ops passed through in C",
    .tp_basicsize = sizeof(Entry),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = entry_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Entry, vectorcall),
    .tp_traverse = (traverseproc)entry_traverse,
    .tp_clear = (inquiry)entry_clear,
    .tp_dealloc = (destructor)entry_dealloc,
    .tp_members = entry_members,
    .tp_methods = entry_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "verify.capture._dispatch",
    "The op capture's dispatch entry in C (see verify/capture/_dispatch.c).", -1, NULL,
};

PyMODINIT_FUNC PyInit__dispatch(void) {
    if (PyType_Ready(&EntryType) < 0)
        return NULL;
    PyObject *created = PyModule_Create(&module);
    if (created == NULL)
        return NULL;
    Py_INCREF(&EntryType);
    if (PyModule_AddObject(created, "Entry", (PyObject *)&EntryType) < 0) {
        Py_DECREF(&EntryType);
        Py_DECREF(created);
        return NULL;
    }
    return created;
}
