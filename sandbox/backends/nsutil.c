/* The few Linux calls the sandbox zygote needs that Python 3.11's os module lacks.
 *
 * The zygote used to reach them through ctypes, but every program's process is a fork of the zygote, and a
 * process with _ctypes loaded hands any program raw memory access without an audit event (its types are
 * reachable through object.__subclasses__(), and _imp.create_dynamic returns the cached module): exactly what
 * the unit-test harness must deny. These functions give nothing a sandboxed program could use: once the
 * sandbox has dropped its capabilities and loaded its seccomp filter, each of them fails.
 *
 * Built by sandbox/backends/nsutil.py with the host's C compiler, once per source version.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

static PyObject *
fail(const char *what)
{
    int err = errno;
    return PyErr_Format(PyExc_OSError, "[Errno %d] %s: %s", err, what, strerror(err));
}

static PyObject *
ns_unshare(PyObject *self, PyObject *args)
{
    int flags;
    if (!PyArg_ParseTuple(args, "i", &flags))
        return NULL;
    if (unshare(flags) != 0)
        return fail("unshare");
    Py_RETURN_NONE;
}

static PyObject *
ns_setns(PyObject *self, PyObject *args)
{
    int fd, nstype;
    if (!PyArg_ParseTuple(args, "ii", &fd, &nstype))
        return NULL;
    if (setns(fd, nstype) != 0)
        return fail("setns");
    Py_RETURN_NONE;
}

static PyObject *
ns_mount(PyObject *self, PyObject *args)
{
    const char *source, *target, *fstype, *data = NULL;
    unsigned long flags;
    if (!PyArg_ParseTuple(args, "zszk|z", &source, &target, &fstype, &flags, &data))
        return NULL;
    if (mount(source, target, fstype, flags, data) != 0)
        return PyErr_Format(PyExc_OSError, "[Errno %d] mount %s: %s", errno, target, strerror(errno));
    Py_RETURN_NONE;
}

static PyObject *
ns_umount2(PyObject *self, PyObject *args)
{
    const char *target;
    int flags;
    if (!PyArg_ParseTuple(args, "si", &target, &flags))
        return NULL;
    if (umount2(target, flags) != 0)
        return PyErr_Format(PyExc_OSError, "[Errno %d] umount %s: %s", errno, target, strerror(errno));
    Py_RETURN_NONE;
}

static PyObject *
ns_pivot_root(PyObject *self, PyObject *args)
{
    const char *new_root, *put_old;
    if (!PyArg_ParseTuple(args, "ss", &new_root, &put_old))
        return NULL;
    if (syscall(SYS_pivot_root, new_root, put_old) != 0)
        return fail("pivot_root");
    Py_RETURN_NONE;
}

static PyObject *
ns_prctl(PyObject *self, PyObject *args)
{
    int option;
    unsigned long arg2 = 0;
    if (!PyArg_ParseTuple(args, "i|k", &option, &arg2))
        return NULL;
    if (prctl(option, arg2, 0UL, 0UL, 0UL) != 0)
        return fail("prctl");
    Py_RETURN_NONE;
}

/* drop_privileges(cap_last, seccomp_filter or None): every capability gone (bounding, ambient, effective,
 * permitted, inheritable), no-new-privs, then the classic-BPF filter (struct sock_filter[]) if given. */
static PyObject *
ns_drop_privileges(PyObject *self, PyObject *args)
{
    int cap_last;
    Py_buffer filter = {0};
    if (!PyArg_ParseTuple(args, "iz*", &cap_last, &filter))
        return NULL;
    PyObject *result = NULL;
    for (int cap = 0; cap <= cap_last; cap++) {
        if (prctl(PR_CAPBSET_DROP, (unsigned long)cap, 0UL, 0UL, 0UL) != 0) {
            fail("drop a bounding capability");
            goto done;
        }
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0UL, 0UL, 0UL) != 0) {
        fail("clear ambient capabilities");
        goto done;
    }
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2] = {{0, 0, 0}, {0, 0, 0}};
    if (syscall(SYS_capset, &header, data) != 0) {
        fail("capset");
        goto done;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1UL, 0UL, 0UL, 0UL) != 0) {
        fail("no-new-privs");
        goto done;
    }
    if (filter.buf != NULL && filter.len > 0) {
        if (filter.len % sizeof(struct sock_filter) != 0 || filter.len / sizeof(struct sock_filter) > 0xFFFF) {
            PyErr_SetString(PyExc_ValueError, "seccomp filter: not a whole number of sock_filter instructions");
            goto done;
        }
        struct sock_fprog prog = {(unsigned short)(filter.len / sizeof(struct sock_filter)),
                                  (struct sock_filter *)filter.buf};
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, (unsigned long)&prog, 0UL, 0UL) != 0) {
            fail("seccomp");
            goto done;
        }
    }
    result = Py_None;
    Py_INCREF(result);
done:
    if (filter.buf != NULL)
        PyBuffer_Release(&filter);
    return result;
}

static PyMethodDef methods[] = {
    {"unshare", ns_unshare, METH_VARARGS, "unshare(flags)"},
    {"setns", ns_setns, METH_VARARGS, "setns(fd, nstype)"},
    {"mount", ns_mount, METH_VARARGS, "mount(source, target, fstype, flags, data=None)"},
    {"umount2", ns_umount2, METH_VARARGS, "umount2(target, flags)"},
    {"pivot_root", ns_pivot_root, METH_VARARGS, "pivot_root(new_root, put_old)"},
    {"prctl", ns_prctl, METH_VARARGS, "prctl(option, arg2=0)"},
    {"drop_privileges", ns_drop_privileges, METH_VARARGS, "drop_privileges(cap_last, seccomp_filter)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef_Slot slots[] = {{0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_agentrl_nsutil", "Namespace, mount and privilege calls for the sandbox zygote.", 0,
    methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__agentrl_nsutil(void)
{
    return PyModuleDef_Init(&module);
}
