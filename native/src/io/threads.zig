//! The portable backend: each read is a job on the runtime's worker pool, which runs the
//! positioned-read loop and then the read's completion hook (so decoding runs on the
//! pool, in parallel). Used where io_uring is refused (old kernels, seccomp, qemu) or
//! chosen (`io_backend="threads"`); under `auto`, the io_uring backend also hands it its
//! large page-cache-resident reads (`uring.Uring.warm`).
//!
//! Invariant: a read that ran leaves `.queued` only under `mutex`, so a waiter that checked
//! the state under the lock cannot miss the broadcast. (`cancel` of a read no worker took
//! sets it idle without the lock: only its owner, the canceller, waits on it.)

const std = @import("std");
const runtime = @import("../base/runtime.zig");
const status = @import("../base/status.zig");
const backend = @import("backend.zig");
const Read = backend.Read;

pub const Threads = struct {
    pool: *runtime.Pool,
    mutex: std.Thread.Mutex = .{},
    cond: std.Thread.Condition = .{},

    pub fn init(pool: *runtime.Pool) Threads {
        return .{ .pool = pool };
    }

    pub fn deinit(t: *Threads) void {
        _ = t;
    }

    pub fn queue(t: *Threads, read: *Read) status.Error!void {
        read.waiter = t;
        t.pool.submit(&read.job);
    }

    /// Jobs start as soon as they are queued.
    pub fn submit(t: *Threads) status.Error!void {
        _ = t;
    }

    pub fn wait(t: *Threads, read: *Read) status.Error!void {
        t.mutex.lock();
        defer t.mutex.unlock();
        while (!read.isDone()) t.cond.wait(&t.mutex);
    }

    pub fn cancel(t: *Threads, read: *Read) void {
        if (t.pool.cancel(&read.job)) {
            read.state.store(.idle, .release);
            return;
        }
        t.mutex.lock();
        defer t.mutex.unlock();
        while (read.state.load(.acquire) == .queued) t.cond.wait(&t.mutex);
    }
};

/// The pool job of a read (see `Read.job`).
pub fn runJob(job: *runtime.Job) void {
    const read: *Read = @fieldParentPtr("job", job);
    const t = read.waiter.?;
    const result = backend.readAll(read.fd, read.buf, read.offset);
    if (result == .ok) read.done_bytes = read.buf.len;
    read.finish(result);
    t.mutex.lock();
    read.state.store(.done, .release);
    t.cond.broadcast();
    t.mutex.unlock();
}
