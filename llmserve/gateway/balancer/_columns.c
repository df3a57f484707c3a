/* The picker's score over column scorers, compiled: the same floating-point operations in the
 * same order as the Python path (each scorer's column, then combine.weighted_mean), so the same
 * bits and the same picks with or without this module, without a Python list and a pass over
 * the candidates per scorer.
 *
 * score(candidates, spec, weights, total) -> list[float] | None
 *   spec[k] is a column already computed (a list of floats: a stateful scorer's), or
 *   (attribute name, rule): rule 0 "lower is better" over exact integers (min-max normalised,
 *   all equal: 1.0), rule 1 "one minus" over floats (None: a neutral 0.5). Every column is
 *   clamped to [0, 1] (NaN: 0), weighted, added left to right and divided by ``total``.
 *   None: a value this code does not take (a non-integer where rule 0 wants one, an integer
 *   beyond 2**52): the caller runs the Python path, which decides for every input.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>

#define EXACT (1LL << 52)  /* so that every difference of two is exact too */

static double clamp(double x) { return (0.0 < x && x < 1.0) ? x : (x >= 1.0 ? 1.0 : 0.0); }

/* One column's values into col[0..n); 0 ok, 1 not handled here, -1 error set. */
static int column(PyObject *cands, Py_ssize_t n, PyObject *entry, double *col) {
    if (PyList_Check(entry)) {
        if (PyList_GET_SIZE(entry) != n) {
            PyErr_SetString(PyExc_ValueError, "a column's length differs from the candidates'");
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *v = PyList_GET_ITEM(entry, i);
            if (!PyFloat_CheckExact(v)) return 1;
            col[i] = PyFloat_AS_DOUBLE(v);
        }
        return 0;
    }
    PyObject *name = PyTuple_GET_ITEM(entry, 0);
    long rule = PyLong_AsLong(PyTuple_GET_ITEM(entry, 1));
    long long lo = 0, hi = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyObject_GetAttr(PyList_GET_ITEM(cands, i), name);
        if (v == NULL) return -1;
        int bad = 0;
        if (rule == 0) {  /* the integer kept as a double: exact below 2**52 */
            int overflow = 0;
            long long x = PyLong_Check(v) ? PyLong_AsLongLongAndOverflow(v, &overflow) : 0;
            bad = !PyLong_Check(v) || overflow || x >= EXACT || x <= -EXACT;
            /* Python's min and max: the first extreme kept */
            if (!bad && (i == 0 || x < lo)) lo = x;
            if (!bad && (i == 0 || x > hi)) hi = x;
            col[i] = (double)x;
        } else if (v == Py_None) {
            col[i] = 0.5;
        } else if (PyFloat_CheckExact(v)) {
            col[i] = 1.0 - PyFloat_AS_DOUBLE(v);
        } else {
            bad = 1;
        }
        Py_DECREF(v);
        if (bad) return 1;
    }
    if (rule == 0) {
        /* (hi - v) / span: the integers' difference is exact, so one rounding, as Python's */
        double span = (double)(hi - lo);
        for (Py_ssize_t i = 0; i < n; i++)
            col[i] = hi <= lo ? 1.0 : (double)(hi - (long long)col[i]) / span;
    }
    return 0;
}

static PyObject *score(PyObject *self, PyObject *args) {
    PyObject *cands, *spec, *weights;
    double total;
    if (!PyArg_ParseTuple(args, "O!O!O!d", &PyList_Type, &cands, &PyTuple_Type, &spec,
                          &PyTuple_Type, &weights, &total))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(cands), k = PyTuple_GET_SIZE(spec);
    if (PyTuple_GET_SIZE(weights) != k) {
        PyErr_SetString(PyExc_ValueError, "one weight per column");
        return NULL;
    }
    double stack[2 * 64], *buf = stack;
    if (n > 64 && (buf = (double *)malloc(2 * n * sizeof(double))) == NULL) return PyErr_NoMemory();
    double *acc = buf, *col = buf + n;
    PyObject *out = NULL;
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *entry = PyTuple_GET_ITEM(spec, j);
        if (!PyList_Check(entry) && !(PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) == 2)) {
            PyErr_SetString(PyExc_TypeError, "a column is a list of floats or (attribute, rule)");
            goto done;
        }
        int r = column(cands, n, entry, col);
        if (r < 0) goto done;
        if (r > 0) { out = Py_None; Py_INCREF(out); goto done; }
        double w = PyFloat_AsDouble(PyTuple_GET_ITEM(weights, j));
        if (w == -1.0 && PyErr_Occurred()) goto done;
        /* left to right, as the Python sum: w0*c0 + w1*c1 + ... */
        for (Py_ssize_t i = 0; i < n; i++)
            acc[i] = j == 0 ? w * clamp(col[i]) : acc[i] + w * clamp(col[i]);
    }
    if ((out = PyList_New(n)) == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PyFloat_FromDouble(k ? acc[i] / total : 0.0);
        if (f == NULL) { Py_CLEAR(out); goto done; }
        PyList_SET_ITEM(out, i, f);
    }
done:
    if (buf != stack) free(buf);
    return out;
}

static PyMethodDef methods[] = {
    {"score", score, METH_VARARGS, "The weighted mean of the clamped columns, per candidate."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_columns", NULL, -1, methods};

PyMODINIT_FUNC PyInit__columns(void) { return PyModule_Create(&module); }
