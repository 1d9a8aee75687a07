//! The io_uring backend: one ring per reader, driven by the thread that queues and waits
//! (the consumer). Reads are queued as SQEs and submitted in one `io_uring_enter`; the
//! waiter reaps completions, continues short reads where they stopped, and runs each
//! read's completion hook on the reaping thread. Reads of 64 KiB and more are punted to
//! io-wq (IOSQE_ASYNC), so their copies use the other cores even when the data is in
//! the page cache. With `warm` (io_backend `auto`), a read of `warm_min_bytes` or more
//! whose bytes are all in the page cache when it is queued, while no read is in flight on
//! the ring, goes to the thread pool instead. Everything that churns between Zig versions
//! or kernels (std's IoUring API, errnos) stays in this file.
//!
//! Invariants:
//! - `in_flight` counts SQEs queued or submitted and not yet reaped; it never exceeds the
//!   ring's capacity, because each read has at most one SQE at a time and the caller
//!   keeps at most `reads_max` reads queued.
//! - Only the owning thread touches the ring (no locks).
//! - A read handed to `warm` has `waiter` set (and never an SQE); a read on the ring has
//!   none (`Read.prepare` clears it): `wait` and `cancel` go where the read is.

const std = @import("std");
const linux = std.os.linux;
const posix = std.posix;
const status = @import("../base/status.zig");
const backend = @import("backend.zig");
const threads = @import("threads.zig");
const files = @import("files.zig");
const Read = backend.Read;

/// Whether this process may use io_uring at all (kernel support, seccomp, limits).
pub fn available() bool {
    var ring = linux.IoUring.init(2, 0) catch return false;
    ring.deinit();
    return true;
}

/// `Uring.warm` takes reads of at least this many bytes: below, a pool hand-off and the
/// `cachestat` cost about what a second core's copy saves.
pub const warm_min_bytes = 256 << 10;

pub const Uring = struct {
    ring: linux.IoUring,
    in_flight: u32 = 0,
    /// Reads of at least this many bytes are punted to the kernel's io-wq workers
    /// (IOSQE_ASYNC) instead of being tried inline in io_uring_enter, where a page-cache
    /// hit is copied on the submitting (consumer) thread: punted, the copies of
    /// page-cache-resident data run on the other cores while the consumer works. Small
    /// reads stay inline (a punt costs more than their copy).
    async_min_bytes: u64 = 64 << 10,
    /// io_backend `auto`: the thread pool, which takes the reads of `warm_min_bytes` or
    /// more whose bytes are all in the page cache (one `cachestat` each) while the ring
    /// has none in flight. io-wq gives a burst of such reads to one kernel worker (it
    /// wakes the same idle worker for each), so one core copies; the pool's workers copy
    /// on every core. Reads that wait for the disk stay on the ring (many in flight, no
    /// worker blocked on each), and so do resident ones queued while such reads are in
    /// flight (shuffled cold reads measured slower when the pool's copies competed with
    /// the io-wq workers that start the disk reads).
    warm: ?threads.Threads = null,

    /// A ring with room for `reads_max` reads (rounded up to a power of two, at most 4096).
    pub fn init(reads_max: u32) error{Unavailable}!Uring {
        const n = std.math.ceilPowerOfTwo(u32, @max(reads_max, 1)) catch return error.Unavailable;
        const ring = linux.IoUring.init(@intCast(@min(n, 4096)), 0) catch return error.Unavailable;
        return .{ .ring = ring };
    }

    pub fn deinit(u: *Uring) void {
        std.debug.assert(u.in_flight == 0);
        u.ring.deinit();
    }

    pub fn queue(u: *Uring, read: *Read) status.Error!void {
        if (u.warm) |*pool| {
            if (read.buf.len >= warm_min_bytes) {
                // Reads the kernel finished are reaped first: only those still waiting
                // keep the ring busy.
                if (u.in_flight > 0) try u.reap(0);
                if (u.in_flight == 0 and files.rangeCached(read.fd, read.offset, read.buf.len)) return pool.queue(read);
            }
        }
        try u.queueRest(read);
    }

    /// Queues the part of `read` not yet read, submitting first when the queue is full.
    fn queueRest(u: *Uring, read: *Read) status.Error!void {
        const at: usize = @intCast(read.done_bytes);
        const buf = read.buf[at..];
        const offset = read.offset + read.done_bytes;
        const sqe = u.ring.read(@intFromPtr(read), read.fd, .{ .buffer = buf }, offset) catch blk: {
            try u.submit();
            break :blk u.ring.read(@intFromPtr(read), read.fd, .{ .buffer = buf }, offset) catch
                return status.fail(error.Internal, "io_uring submission queue stays full", .{});
        };
        if (buf.len >= u.async_min_bytes) sqe.flags |= linux.IOSQE_ASYNC;
        u.in_flight += 1;
        std.debug.assert(u.in_flight <= u.ring.sq.sqes.len + u.ring.cq.cqes.len);
    }

    pub fn submit(u: *Uring) status.Error!void {
        if (u.ring.sq_ready() == 0) return;
        try u.enter(0);
    }

    fn enter(u: *Uring, wait_nr: u32) status.Error!void {
        while (true) {
            _ = u.ring.submit_and_wait(wait_nr) catch |err| switch (err) {
                error.SignalInterrupt => continue,
                else => return status.failIo(err, "io_uring_enter"),
            };
            return;
        }
    }

    /// Handles the completions that are ready, without waiting.
    pub fn poll(u: *Uring) status.Error!void {
        if (u.in_flight == 0) return;
        try u.reap(0);
    }

    pub fn wait(u: *Uring, read: *Read) status.Error!void {
        if (read.waiter) |pool| return pool.wait(read);
        while (!read.isDone()) try u.reap(1);
    }

    /// io_uring reads cannot be taken back cheaply: wait for the read instead.
    pub fn cancel(u: *Uring, read: *Read) void {
        if (read.waiter) |pool| return pool.cancel(read);
        while (read.state.load(.acquire) == .queued) u.reap(1) catch {
            // io_uring_enter itself fails: nothing more can be reaped from this ring. Stop
            // waiting; the owner tears the ring down next (closing it ends its requests).
            read.state.store(.idle, .release);
            u.in_flight -|= 1;
            return;
        };
    }

    /// Handles the ready completions, waiting for at least `wait_nr` of them: finished
    /// reads run their hook and become done, short ones continue where they stopped.
    fn reap(u: *Uring, wait_nr: u32) status.Error!void {
        // Reads queued but not yet submitted would never complete: submit them first.
        try u.submit();
        var cqes: [64]linux.io_uring_cqe = undefined;
        const n = while (true) {
            break u.ring.copy_cqes(&cqes, wait_nr) catch |err| switch (err) {
                error.SignalInterrupt => continue,
                else => return status.failIo(err, "io_uring_enter"),
            };
        };
        u.in_flight -= n;
        var resubmit = false;
        for (cqes[0..n]) |cqe| {
            const read: *Read = @ptrFromInt(cqe.user_data);
            std.debug.assert(read.state.load(.monotonic) == .queued);
            const result: backend.Result = if (cqe.res < 0)
                .{ .os = @enumFromInt(-cqe.res) }
            else if (cqe.res == 0)
                .eof
            else blk: {
                read.done_bytes += @intCast(cqe.res);
                std.debug.assert(read.done_bytes <= read.buf.len);
                if (read.done_bytes < read.buf.len) {
                    try u.queueRest(read);
                    resubmit = true;
                    continue;
                }
                break :blk .ok;
            };
            read.finish(result);
            read.state.store(.done, .release);
        }
        if (resubmit) try u.submit();
    }
};
