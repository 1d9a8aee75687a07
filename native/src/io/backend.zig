//! The I/O layer's one interface: positioned reads into caller buffers, queued, submitted,
//! completed in any order and reaped, plus a synchronous read for lookups. Two backends
//! implement it, one file each: `uring.zig` (io_uring, one ring per reader, driven by the
//! consumer thread) and `threads.zig` (the runtime's worker pool running `pread`). The
//! reader holds one `Io` and never asks which backend runs; adding a backend is one new
//! file here and one member of `Io`.
//!
//! Invariants:
//! - A `Read` is owned by its submitter and never moves or is freed while it is queued
//!   (`state == .queued`); the backends never allocate per read.
//! - A read is reported done (`state == .done`, release store) only after its `complete`
//!   hook has run, so every byte and field the hook wrote is visible to the thread that
//!   observes `.done` (acquire load).
//! - After `cancel(read)` returns, no backend touches the read or its buffer again.

const std = @import("std");
const posix = std.posix;
const status = @import("../base/status.zig");
const runtime = @import("../base/runtime.zig");
const uring = @import("uring.zig");
const threads = @import("threads.zig");

/// A backend that runs.
pub const Kind = enum { io_uring, threads };

/// What a configuration asks for; `auto` is io_uring where the kernel allows it.
pub const Choice = enum { auto, io_uring, threads };

/// The backend for `choice` in this process, or error.InvalidArgument when io_uring is
/// asked for explicitly and refused.
pub fn resolve(choice: Choice) status.Error!Kind {
    return switch (choice) {
        .threads => .threads,
        .io_uring => if (uring.available()) .io_uring else status.fail(error.InvalidArgument, "io_backend 'io_uring' is not available here (the kernel or a seccomp filter refuses io_uring_setup); use 'auto' or 'threads'", .{}),
        .auto => if (uring.available()) .io_uring else .threads,
    };
}

/// How a read ended.
pub const Result = union(enum) {
    pending,
    ok,
    /// End of file before the buffer was full (the file is shorter than planned).
    eof,
    /// The OS refused the read.
    os: posix.E,
};

/// One positioned read of `buf.len` bytes at `offset` of `fd`, intrusive like
/// `runtime.Job`: its owner keeps it alive and still until it is done or cancelled.
pub const Read = struct {
    fd: posix.fd_t = -1,
    buf: []u8 = &.{},
    offset: u64 = 0,
    /// Bytes read so far: a short read continues from here.
    done_bytes: u64 = 0,
    result: Result = .pending,
    /// Runs once where the read finishes (a pool worker, or the thread reaping the ring),
    /// before the read is reported done. It may fail the read by its own bookkeeping but
    /// must not block on other reads.
    complete: *const fn (read: *Read) void,
    state: std.atomic.Value(State) = .init(.idle),
    /// The threads backend's pool job and its waiter (set when queued).
    job: runtime.Job = .{ .run = threads.runJob },
    waiter: ?*threads.Threads = null,

    pub const State = enum(u8) { idle, queued, done };

    /// Prepares an idle or done read for queueing.
    pub fn prepare(r: *Read, fd: posix.fd_t, buf: []u8, offset: u64) void {
        std.debug.assert(r.state.load(.monotonic) != .queued);
        r.fd = fd;
        r.buf = buf;
        r.offset = offset;
        r.done_bytes = 0;
        r.result = .pending;
        r.state.store(.idle, .monotonic);
    }

    /// Completes a read that needs no I/O (it failed before, or has nothing to read):
    /// waiting for it returns at once.
    pub fn skip(r: *Read) void {
        std.debug.assert(r.state.load(.monotonic) == .idle);
        r.state.store(.done, .release);
    }

    pub fn isDone(r: *const Read) bool {
        return r.state.load(.acquire) == .done;
    }

    /// Records the outcome and runs the completion hook; the backend then publishes the
    /// read as done.
    pub fn finish(r: *Read, result: Result) void {
        std.debug.assert(r.state.load(.monotonic) == .queued);
        r.result = result;
        r.complete(r);
    }
};

/// The backend of one reader.
pub const Io = union(Kind) {
    io_uring: uring.Uring,
    threads: threads.Threads,

    /// A backend of `kind` that can keep `reads_max` reads in flight. io_uring falls back
    /// to the thread pool when the ring cannot be created (ENOMEM from locked-memory
    /// limits, a seccomp filter installed after the probe): same results, other engine.
    pub fn init(wanted: Kind, reads_max: u32, pool: *runtime.Pool) Io {
        return switch (wanted) {
            .io_uring => if (uring.Uring.init(reads_max)) |u| .{ .io_uring = u } else |_| .{ .threads = threads.Threads.init(pool) },
            .threads => .{ .threads = threads.Threads.init(pool) },
        };
    }

    /// Precondition: nothing queued (cancel every read first).
    pub fn deinit(io: *Io) void {
        switch (io.*) {
            inline else => |*b| b.deinit(),
        }
    }

    pub fn kind(io: *const Io) Kind {
        return std.meta.activeTag(io.*);
    }

    /// Queues `read` (prepared). It may start before `submit`.
    pub fn queue(io: *Io, read: *Read) status.Error!void {
        std.debug.assert(read.state.load(.monotonic) == .idle);
        std.debug.assert(read.buf.len > 0);
        read.state.store(.queued, .monotonic);
        switch (io.*) {
            inline else => |*b| try b.queue(read),
        }
    }

    /// Starts every queued read.
    pub fn submit(io: *Io) status.Error!void {
        switch (io.*) {
            inline else => |*b| try b.submit(),
        }
    }

    /// Returns once `read` is done, completing others on the way.
    pub fn wait(io: *Io, read: *Read) status.Error!void {
        if (read.isDone()) return;
        // Queued or, on another thread, just done: never idle (only the owner sets that).
        std.debug.assert(read.state.load(.acquire) != .idle);
        switch (io.*) {
            inline else => |*b| try b.wait(read),
        }
        std.debug.assert(read.isDone());
    }

    /// Takes `read` back: dequeued if it has not started, else waited for. Afterwards the
    /// backend no longer touches it (it is idle or done).
    pub fn cancel(io: *Io, read: *Read) void {
        if (read.state.load(.acquire) != .queued) return;
        switch (io.*) {
            inline else => |*b| b.cancel(read),
        }
        std.debug.assert(read.state.load(.acquire) != .queued);
    }
};

/// Runs a prepared, idle `read` to completion on the calling thread (`readAll`, then its
/// hook), without a backend: for a read the caller is about to wait for anyway (an
/// iterator's first record), where a hand-off to another thread only adds latency.
pub fn runInline(read: *Read) void {
    std.debug.assert(read.state.load(.monotonic) == .idle and read.buf.len > 0);
    read.state.store(.queued, .monotonic);
    const result = readAll(read.fd, read.buf, read.offset);
    if (result == .ok) read.done_bytes = read.buf.len;
    read.finish(result);
    read.state.store(.done, .release);
}

/// Fills `buf` from `offset` of `fd` with positioned reads (a short read continues),
/// on the calling thread: lookups and the thread pool share this one loop.
pub fn readAll(fd: posix.fd_t, buf: []u8, offset: u64) Result {
    var done: usize = 0;
    while (done < buf.len) {
        const n = posix.pread(fd, buf[done..], offset + done) catch |err| return .{ .os = errnoOf(err) };
        if (n == 0) return .eof;
        done += n;
    }
    return .ok;
}

/// The errno behind a pread error (std maps errnos to errors; the message wants the number).
fn errnoOf(err: posix.PReadError) posix.E {
    return switch (err) {
        error.InputOutput => .IO,
        error.SystemResources => .NOMEM,
        error.IsDir => .ISDIR,
        error.Unseekable => .SPIPE,
        error.AccessDenied => .ACCES,
        error.WouldBlock => .AGAIN,
        error.ConnectionResetByPeer => .CONNRESET,
        error.ConnectionTimedOut => .TIMEDOUT,
        error.NotOpenForReading => .BADF,
        error.SocketNotConnected => .NOTCONN,
        error.Canceled => .CANCELED,
        error.ProcessNotFound => .SRCH,
        error.LockViolation => .DEADLK,
        error.OperationAborted => .CANCELED,
        error.BrokenPipe => .PIPE,
        error.Unexpected => .INVAL,
    };
}

// ---------------------------------------------------------------- tests

const testing = std.testing;

/// The same test body runs against both backends.
fn expectBackendReads(kind: Kind) !void {
    const rt = try runtime.Runtime.open(testing.allocator, 2);
    defer rt.release();
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var data: [64 * 1024]u8 = undefined;
    for (&data, 0..) |*b, i| b.* = @truncate(i *% 31 +% 7);
    try tmp.dir.writeFile(.{ .sub_path = "f", .data = &data });
    const file = try tmp.dir.openFile("f", .{});
    defer file.close();

    const Probe = struct {
        read: Read = .{ .complete = onComplete },
        completions: u32 = 0,
        fn onComplete(r: *Read) void {
            const p: *@This() = @fieldParentPtr("read", r);
            p.completions += 1;
        }
    };
    var io = Io.init(kind, 8, &rt.pool);
    defer io.deinit();
    if (io.kind() != kind) return error.SkipZigTest; // io_uring refused here
    var bufs: [8][1000]u8 = undefined;
    var probes: [8]Probe = [_]Probe{.{}} ** 8;
    // Two rounds reuse the same reads; the last read runs past the end of the file.
    for (0..2) |round| {
        for (&probes, &bufs, 0..) |*p, *b, i| {
            const offset: u64 = if (i == 7) data.len - 10 else i * 5000 + round;
            p.read.prepare(file.handle, b, offset);
            try io.queue(&p.read);
        }
        try io.submit();
        // Wait in reverse order: completions arrive in any order.
        var i: usize = probes.len;
        while (i > 0) {
            i -= 1;
            try io.wait(&probes[i].read);
        }
        for (probes[0..7], bufs[0..7], 0..) |p, b, k| {
            try testing.expectEqual(Result.ok, p.read.result);
            try testing.expectEqualSlices(u8, data[k * 5000 + round ..][0..1000], &b);
        }
        try testing.expectEqual(Result.eof, probes[7].read.result);
        for (probes) |p| try testing.expectEqual(@as(u32, @intCast(round + 1)), p.completions);
    }
    // A cancelled read is never touched again.
    probes[0].read.prepare(file.handle, &bufs[0], 0);
    try io.queue(&probes[0].read);
    io.cancel(&probes[0].read);
    try testing.expect(probes[0].read.state.load(.acquire) != .queued);
    // A bad descriptor is an OS error, not a crash.
    probes[1].read.prepare(-1, &bufs[1], 0);
    try io.queue(&probes[1].read);
    try io.submit();
    try io.wait(&probes[1].read);
    try testing.expectEqual(Result{ .os = .BADF }, probes[1].read.result);
}

test "io_uring backend: reads, short reads, completion order, cancel, errors" {
    try expectBackendReads(.io_uring);
}

test "threads backend: reads, short reads, completion order, cancel, errors" {
    try expectBackendReads(.threads);
}

test "readAll fills the buffer or says why not" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    try tmp.dir.writeFile(.{ .sub_path = "f", .data = "0123456789" });
    const file = try tmp.dir.openFile("f", .{});
    defer file.close();
    var buf: [4]u8 = undefined;
    try testing.expectEqual(Result.ok, readAll(file.handle, &buf, 3));
    try testing.expectEqualStrings("3456", &buf);
    try testing.expectEqual(Result.eof, readAll(file.handle, &buf, 8));
    try testing.expectEqual(Result{ .os = .BADF }, readAll(-1, &buf, 0));
}

test "runInline completes a read on the calling thread and runs its hook" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    try tmp.dir.writeFile(.{ .sub_path = "f", .data = "0123456789" });
    const file = try tmp.dir.openFile("f", .{});
    defer file.close();
    const Probe = struct {
        read: Read = .{ .complete = onComplete },
        completions: u32 = 0,
        fn onComplete(r: *Read) void {
            const p: *@This() = @fieldParentPtr("read", r);
            p.completions += 1;
        }
    };
    var probe: Probe = .{};
    var buf: [4]u8 = undefined;
    probe.read.prepare(file.handle, &buf, 2);
    runInline(&probe.read);
    try testing.expect(probe.read.isDone());
    try testing.expectEqual(Result.ok, probe.read.result);
    try testing.expectEqualStrings("2345", &buf);
    try testing.expectEqual(@as(u32, 1), probe.completions);
    // Past the end: eof, still done and hooked.
    probe.read.prepare(file.handle, &buf, 8);
    runInline(&probe.read);
    try testing.expectEqual(Result.eof, probe.read.result);
    try testing.expectEqual(@as(u32, 2), probe.completions);
}
