/*
 * airlock's QuickJS host for the wasm tier's JavaScript code contexts.
 *
 * A WASI preview 1 command. It evaluates one JavaScript source, the kernel
 * (airlock/interp/kernels/quickjs.js), which the Go side hands over as the
 * first request; the kernel then reads cell requests and writes messages
 * through the few primitives below, exposed to it as the global `__host`.
 * WASI preview 1 has no file descriptors beyond stdio and preopened
 * directories, so the kernel's request and message pipes are reached through
 * host functions of the import module "airlock" that the Go side
 * (runtime/wasm) provides:
 *
 *   poll(timeout_ms) -> n   wait up to timeout_ms (-1: forever) for the
 *                           next request: its length, -1 at end of input,
 *                           -2 if none arrived in time
 *   take(ptr)               copy that request (n bytes) to ptr
 *   write(fd, ptr, n) -> n  write to fd 1, 2 (output), 4 (messages),
 *                           5 or 6 (sync markers); -1 on error
 *   interrupted() -> n      the newest cell number an interrupt asked for
 *
 * Nothing here parses what the sandbox's user controls beyond what QuickJS
 * itself does: cells are JavaScript for QuickJS to run.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quickjs.h"

#define IMPORT(name) __attribute__((import_module("airlock"), import_name(name)))

IMPORT("poll") int32_t airlock_poll(int32_t timeout_ms);
IMPORT("take") void airlock_take(void *ptr);
IMPORT("write") int32_t airlock_write(int32_t fd, const void *ptr, int32_t n);
IMPORT("interrupted") int32_t airlock_interrupted(void);

extern char **environ;

/* The cell that interrupts may stop, and its deadline (ms since the epoch;
   0: none). They apply only while a cell's code runs (in_user: inside
   evalScript or runJobs), never to the kernel's own code. */
static int armed, in_user;
static int32_t armed_cell;
static double armed_deadline;
static int stop_reason; /* 1 interrupted, 2 timed out */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int interrupt_handler(JSRuntime *rt, void *opaque)
{
    (void)rt;
    (void)opaque;
    if (!armed || !in_user)
        return 0;
    if (armed_cell > 0 && airlock_interrupted() == armed_cell) {
        stop_reason = 1;
        return 1;
    }
    if (armed_deadline > 0 && now_ms() >= armed_deadline) {
        stop_reason = 2;
        return 1;
    }
    return 0;
}

/* __host.poll(timeout_ms): a request string, null at end of input,
   undefined when none arrived in time. */
static JSValue host_poll(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv)
{
    int32_t timeout = -1, n;
    char *buf;
    JSValue v;
    if (argc > 0 && JS_ToInt32(ctx, &timeout, argv[0]))
        return JS_EXCEPTION;
    n = airlock_poll(timeout);
    if (n == -1)
        return JS_NULL;
    if (n < 0)
        return JS_UNDEFINED;
    buf = malloc(n + 1);
    if (!buf)
        return JS_ThrowOutOfMemory(ctx);
    airlock_take(buf);
    buf[n] = '\0';
    v = JS_NewStringLen(ctx, buf, n);
    free(buf);
    return v;
}

/* __host.write(fd, string): writes all of it; false if the fd is gone. */
static JSValue host_write(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv)
{
    int32_t fd;
    size_t len, off = 0;
    const char *s;
    if (argc < 2 || JS_ToInt32(ctx, &fd, argv[0]))
        return JS_EXCEPTION;
    s = JS_ToCStringLen(ctx, &len, argv[1]);
    if (!s)
        return JS_EXCEPTION;
    while (off < len) {
        int32_t k = airlock_write(fd, s + off, (int32_t)(len - off));
        if (k <= 0) {
            JS_FreeCString(ctx, s);
            return JS_FALSE;
        }
        off += k;
    }
    JS_FreeCString(ctx, s);
    return JS_TRUE;
}

/* __host.arm(cell, deadline_ms) / __host.disarm(): what the interrupt
   handler may stop. */
static JSValue host_arm(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv)
{
    int32_t cell = 0;
    double deadline = 0;
    if (argc < 2 || JS_ToInt32(ctx, &cell, argv[0]) || JS_ToFloat64(ctx, &deadline, argv[1]))
        return JS_EXCEPTION;
    armed_cell = cell;
    armed_deadline = deadline;
    armed = 1;
    stop_reason = 0;
    return JS_UNDEFINED;
}

static JSValue host_disarm(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv)
{
    armed = 0;
    return JS_UNDEFINED;
}

/* Takes the pending exception as a completion record {error, stopped}:
   stopped is "interrupted" or "timeout" when the interrupt handler ended
   the code (an uncatchable error the kernel must not see as a throw). */
static JSValue completion_error(JSContext *ctx)
{
    JSValue exc = JS_GetException(ctx);
    JSValue rec = JS_NewObject(ctx);
    JS_SetPropertyStr(ctx, rec, "error", exc);
    if (stop_reason)
        JS_SetPropertyStr(ctx, rec, "stopped", JS_NewString(ctx, stop_reason == 1 ? "interrupted" : "timeout"));
    stop_reason = 0;
    return rec;
}

/* __host.evalScript(code, filename): {value} or {error[, stopped]}; the
   code runs as a global script, so its top-level declarations persist. */
static JSValue host_eval(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv)
{
    size_t len;
    const char *code, *file;
    JSValue v, rec;
    if (argc < 2)
        return JS_ThrowTypeError(ctx, "evalScript(code, filename)");
    code = JS_ToCStringLen(ctx, &len, argv[0]);
    if (!code)
        return JS_EXCEPTION;
    file = JS_ToCString(ctx, argv[1]);
    if (!file) {
        JS_FreeCString(ctx, code);
        return JS_EXCEPTION;
    }
    in_user++;
    v = JS_Eval(ctx, code, len, file, JS_EVAL_TYPE_GLOBAL);
    in_user--;
    JS_FreeCString(ctx, code);
    JS_FreeCString(ctx, file);
    if (JS_IsException(v))
        return completion_error(ctx);
    rec = JS_NewObject(ctx);
    JS_SetPropertyStr(ctx, rec, "value", v);
    return rec;
}

/* __host.runJobs(): runs pending promise jobs until none is left; returns
   an array of the completion records of jobs that threw. */
static JSValue host_run_jobs(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv)
{
    JSRuntime *rt = JS_GetRuntime(ctx);
    JSContext *jctx;
    JSValue errs = JS_NewArray(ctx);
    uint32_t n = 0;
    for (;;) {
        int r;
        in_user++;
        r = JS_ExecutePendingJob(rt, &jctx);
        in_user--;
        if (r == 0)
            break;
        if (r < 0)
            JS_SetPropertyUint32(ctx, errs, n++, completion_error(jctx));
    }
    return errs;
}

/* __host.call(fn, args): calls fn (a timer's callback) as a cell's code:
   {value} or {error[, stopped]}. */
static JSValue host_call(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv)
{
    JSValue args[16], v, rec;
    uint32_t n = 0;
    int64_t len = 0;
    if (argc < 2 || !JS_IsFunction(ctx, argv[0]))
        return JS_ThrowTypeError(ctx, "call(fn, args)");
    {
        JSValue l = JS_GetPropertyStr(ctx, argv[1], "length");
        int r = JS_ToInt64(ctx, &len, l);
        JS_FreeValue(ctx, l);
        if (r)
            return JS_EXCEPTION;
    }
    if (len > 16)
        len = 16;
    for (n = 0; n < (uint32_t)len; n++)
        args[n] = JS_GetPropertyUint32(ctx, argv[1], n);
    in_user++;
    v = JS_Call(ctx, argv[0], JS_UNDEFINED, (int)n, args);
    in_user--;
    for (uint32_t i = 0; i < n; i++)
        JS_FreeValue(ctx, args[i]);
    if (JS_IsException(v))
        return completion_error(ctx);
    rec = JS_NewObject(ctx);
    JS_SetPropertyStr(ctx, rec, "value", v);
    return rec;
}

/* __host.env(): the process environment as an object. */
static JSValue host_env(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv)
{
    JSValue obj = JS_NewObject(ctx);
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        JSAtom key;
        if (!eq || eq == *e)
            continue;
        key = JS_NewAtomLen(ctx, *e, eq - *e);
        JS_SetProperty(ctx, obj, key, JS_NewString(ctx, eq + 1));
        JS_FreeAtom(ctx, key);
    }
    return obj;
}

/* __host.memoryUsage(): bytes the JS heap holds. */
static JSValue host_memory(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv)
{
    JSMemoryUsage u;
    JS_ComputeMemoryUsage(JS_GetRuntime(ctx), &u);
    return JS_NewInt64(ctx, u.malloc_size);
}

static const JSCFunctionListEntry host_funcs[] = {
    JS_CFUNC_DEF("poll", 1, host_poll),
    JS_CFUNC_DEF("write", 2, host_write),
    JS_CFUNC_DEF("arm", 2, host_arm),
    JS_CFUNC_DEF("disarm", 0, host_disarm),
    JS_CFUNC_DEF("evalScript", 2, host_eval),
    JS_CFUNC_DEF("runJobs", 0, host_run_jobs),
    JS_CFUNC_DEF("call", 2, host_call),
    JS_CFUNC_DEF("env", 0, host_env),
    JS_CFUNC_DEF("memoryUsage", 0, host_memory),
};

static void die(const char *what)
{
    const char *pre = "airlock quickjs: ";
    airlock_write(2, pre, (int32_t)strlen(pre));
    airlock_write(2, what, (int32_t)strlen(what));
    airlock_write(2, "\n", 1);
    exit(70);
}

int main(int argc, char **argv)
{
    JSRuntime *rt;
    JSContext *ctx;
    JSValue host, global, v;
    int32_t n;
    char *src;
    long long limit = 0;

    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--memory-limit") == 0)
            limit = atoll(argv[i + 1]);

    rt = JS_NewRuntime();
    if (!rt)
        die("cannot allocate the runtime");
    if (limit > 0)
        JS_SetMemoryLimit(rt, (size_t)limit);
    /* QuickJS counts its C stack (8 MiB at link time) and throws
       InternalError past this; it must come well before wazero's own
       native stack ceiling, which a trap would hit: measured, 6 MiB of
       recursion overflows wazero's stack and 1 MiB does not
       (runtime/wasm TestQuickJSKernel's recursion cells). */
    JS_SetMaxStackSize(rt, 1 << 20);
    JS_SetInterruptHandler(rt, interrupt_handler, NULL);
    ctx = JS_NewContext(rt);
    if (!ctx)
        die("cannot allocate the context");

    global = JS_GetGlobalObject(ctx);
    host = JS_NewObject(ctx);
    JS_SetPropertyFunctionList(ctx, host, host_funcs, sizeof(host_funcs) / sizeof(host_funcs[0]));
    JS_DefinePropertyValueStr(ctx, global, "__host", host, JS_PROP_CONFIGURABLE);
    JS_FreeValue(ctx, global);

    /* the first request is the kernel's source */
    n = airlock_poll(-1);
    if (n < 0)
        die("no kernel source");
    src = malloc(n + 1);
    if (!src)
        die("out of memory");
    airlock_take(src);
    src[n] = '\0';
    v = JS_Eval(ctx, src, n, "airlock-kernel.js", JS_EVAL_TYPE_GLOBAL);
    free(src);
    if (JS_IsException(v)) {
        JSValue exc = JS_GetException(ctx);
        const char *msg = JS_ToCString(ctx, exc);
        die(msg ? msg : "the kernel failed");
    }
    JS_FreeValue(ctx, v);
    return 0;
}
