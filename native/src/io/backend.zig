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

/// What a configuration asks for; `auto` is io_uring where the kernel allows it, handing
/// large page-cache-resident reads to the thread pool (`uring.Uring.warm`).
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
    /// The pool job of a read the thread pool runs, and its waiter (set when queued to
    /// the pool, by either backend; null otherwise).
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
        r.waiter = null;
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
    /// `choice` `auto`: an io_uring backend hands large reads whose bytes are all in the
    /// page cache to the thread pool (`uring.Uring.warm`).
    pub fn init(wanted: Kind, reads_max: u32, pool: *runtime.Pool, choice: Choice) Io {
        return switch (wanted) {
            .io_uring => if (uring.Uring.init(reads_max)) |ring| blk: {
                var u = ring;
                if (choice == .auto) u.warm = threads.Threads.init(pool);
                break :blk .{ .io_uring = u };
            } else |_| .{ .threads = threads.Threads.init(pool) },
            .threads => .{ .threads = threads.Threads.init(pool) },
        };
    }

    /// The backend that ran `read` (done): the thread pool for a read an io_uring
    /// backend handed to it (`uring.Uring.warm`), else this one.
    pub fn ranBy(io: *const Io, read: *const Read) Kind {
        return if (read.waiter != null) .threads else io.kind();
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

    /// Completes reads that have finished, without waiting (io_uring reaps its ready
    /// completions on this thread; the pool's workers complete reads themselves).
    pub fn poll(io: *Io) status.Error!void {
        switch (io.*) {
            .io_uring => |*u| try u.poll(),
            .threads => {},
        }
    }

    /// Reads the backend keeps in flight while the calling thread runs the rest of a
    /// batch of reads itself (`Shared`), or null when the backend takes them all.
    /// io_uring: page-cache hits punted to io-wq in one burst are copied by one kernel
    /// worker (io-wq wakes the same idle worker for each and starts another only when
    /// none is idle), so the consumer, which would only wait, copies too; a few reads
    /// are kept in flight so the worker never starves between the consumer's reads.
    /// The thread pool already copies on every worker: the consumer would only compete
    /// with them for the cores. So does io_uring with io_backend `auto`, whose pool takes
    /// the page-cache-resident reads such batches hold.
    fn sharedAhead(io: *const Io) ?usize {
        return switch (io.*) {
            .io_uring => |*u| if (u.warm != null) null else uring_shared_ahead,
            .threads => null,
        };
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

/// `Io.sharedAhead` for io_uring: enough that the io-wq worker has the next read queued
/// while the consumer runs one (a read each, about the same time), few enough that the
/// consumer keeps about half.
const uring_shared_ahead = 4;

/// A batch of reads, `@field(item, field)` of each item of a slice, run to completion
/// in any order, shared between the backend and the calling thread (which would only
/// wait for the whole batch: a contiguous batch's payloads). The backend takes reads
/// from the front, as they are prepared (`feed`), while it has fewer than
/// `Io.sharedAhead` in flight; `finish` has the calling thread run reads from the back
/// (`runInline`), topping the backend up between them, until the two meet, then waits
/// for the backend's. On io_uring both cores copy where io-wq alone would use one; the
/// thread pool takes every read as it comes (its workers already use the cores). Each
/// read's hook runs once, on whichever thread ran it; results are the same either way.
pub fn Shared(comptime T: type, comptime field: []const u8) type {
    return struct {
        const Self = @This();
        ahead: usize,
        /// items[0..front] were handed to the backend (or done already);
        /// items[oldest..front] may still be in flight.
        front: usize = 0,
        oldest: usize = 0,

        pub fn init(io: *const Io) Self {
            return .{ .ahead = io.sharedAhead() orelse std.math.maxInt(usize) };
        }

        /// Hands the backend reads of `items[front..end]` (prepared, idle or done) while
        /// it has fewer than `ahead` in flight. `items` only grows between calls.
        pub fn feed(s: *Self, io: *Io, items: []T, end: usize) status.Error!void {
            std.debug.assert(s.front <= end and end <= items.len);
            if (s.front == end) return;
            if (s.front - s.oldest >= s.ahead) {
                try io.poll();
                while (s.oldest < s.front and @field(items[s.oldest], field).isDone()) s.oldest += 1;
            }
            var queued = false;
            while (s.front < end and s.front - s.oldest < s.ahead) : (s.front += 1) {
                const read = &@field(items[s.front], field);
                if (read.isDone()) continue;
                try io.queue(read);
                queued = true;
            }
            if (queued) try io.submit();
        }

        /// Runs every read of `items` (all prepared) to completion and returns once each
        /// is done. On a backend failure the caller cancels the reads still queued.
        pub fn finish(s: *Self, io: *Io, items: []T) status.Error!void {
            var back = items.len;
            while (true) {
                try s.feed(io, items, back);
                if (s.front >= back) break;
                back -= 1;
                const read = &@field(items[back], field);
                if (!read.isDone()) runInline(read);
            }
            for (items[0..s.front]) |*item| try io.wait(&@field(item, field));
        }
    };
}

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

/// A test read that counts its completions.
const Probe = struct {
    read: Read = .{ .complete = onComplete },
    completions: u32 = 0,
    fn onComplete(r: *Read) void {
        const p: *@This() = @fieldParentPtr("read", r);
        p.completions += 1;
    }
};

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

    var io = Io.init(kind, 8, &rt.pool, .auto);
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

/// Shared: every read done once with the right bytes, whichever thread ran it; a read
/// done before (skipped) is left alone; on io_uring the calling thread ran some reads.
fn expectSharedReads(kind: Kind) !void {
    const rt = try runtime.Runtime.open(testing.allocator, 2);
    defer rt.release();
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var data: [64 * 1024]u8 = undefined;
    for (&data, 0..) |*b, i| b.* = @truncate(i *% 13 +% 5);
    try tmp.dir.writeFile(.{ .sub_path = "f", .data = &data });
    const file = try tmp.dir.openFile("f", .{});
    defer file.close();

    const Item = struct {
        read: Read = .{ .complete = onComplete },
        completions: u32 = 0,
        thread: std.Thread.Id = 0,
        fn onComplete(r: *Read) void {
            const p: *@This() = @fieldParentPtr("read", r);
            p.completions += 1;
            p.thread = std.Thread.getCurrentId();
        }
    };
    var io = Io.init(kind, 16, &rt.pool, .auto);
    defer io.deinit();
    if (io.kind() != kind) return error.SkipZigTest; // io_uring refused here
    var bufs: [16][1000]u8 = undefined;
    var items: [16]Item = [_]Item{.{}} ** 16;
    const skipped = 5;
    for (0..3) |round| {
        for (&items, &bufs, 0..) |*item, *b, i| {
            item.read.prepare(file.handle, b, i * 3000 + round);
            if (i == skipped) {
                item.read.result = .ok;
                item.read.skip();
            }
        }
        var shared = Shared(Item, "read").init(&io);
        // Fed as prepared (a batch's reads are), in uneven steps.
        try shared.feed(&io, &items, 3);
        try shared.feed(&io, &items, 3);
        try shared.feed(&io, &items, 11);
        try shared.finish(&io, &items);
        var here: usize = 0;
        for (items, bufs, 0..) |item, b, i| {
            try testing.expect(item.read.isDone());
            try testing.expectEqual(Result.ok, item.read.result);
            if (i == skipped) {
                try testing.expectEqual(@as(u32, 0), item.completions);
                continue;
            }
            try testing.expectEqual(@as(u32, @intCast(round + 1)), item.completions);
            try testing.expectEqualSlices(u8, data[i * 3000 + round ..][0..1000], &b);
            if (item.thread == std.Thread.getCurrentId()) here += 1;
        }
        switch (kind) {
            // The last read is always the calling thread's (the backend keeps only a few
            // ahead); the pool's workers run every read.
            .io_uring => try testing.expect(here >= 1 and items[15].thread == std.Thread.getCurrentId()),
            .threads => try testing.expectEqual(@as(usize, 0), here),
        }
    }
    // None of them.
    var none = Shared(Item, "read").init(&io);
    try none.finish(&io, items[0..0]);
}

test "Shared: io_uring and the calling thread share reads" {
    try expectSharedReads(.io_uring);
}

test "Shared: the thread pool runs every read" {
    try expectSharedReads(.threads);
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

test "io_uring with io_backend auto: large reads in the page cache go to the thread pool while the ring is idle, the rest to the ring" {
    const rt = try runtime.Runtime.open(testing.allocator, 2);
    defer rt.release();
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const part: usize = uring.warm_min_bytes;
    const data = try testing.allocator.alloc(u8, 4 * part);
    defer testing.allocator.free(data);
    for (data, 0..) |*b, i| b.* = @truncate(i *% 29 +% 3);
    try tmp.dir.writeFile(.{ .sub_path = "f", .data = data });
    const file = try tmp.dir.openFile("f", .{});
    defer file.close();
    const files = @import("files.zig");

    const bufs = try testing.allocator.alloc(u8, 4 * part);
    defer testing.allocator.free(bufs);
    for ([_]Choice{ .auto, .io_uring }) |choice| {
        var io = Io.init(.io_uring, 8, &rt.pool, choice);
        defer io.deinit();
        if (io.kind() != .io_uring) return error.SkipZigTest; // io_uring refused here
        if (!files.rangeCached(file.handle, 0, data.len)) return error.SkipZigTest; // no cachestat
        // A batch shared with the calling thread (`Shared`): with the pool behind it the
        // backend takes every read; on the ring alone the caller runs some itself.
        try testing.expectEqual(if (choice == .auto) null else @as(?usize, uring_shared_ahead), io.sharedAhead());
        var probes: [4]Probe = [_]Probe{.{}} ** 4;
        // Three reads of the lane's minimum, all in the page cache, and one just under it.
        for (&probes, 0..) |*p, i| {
            const len = if (i == 3) part - 1 else part;
            p.read.prepare(file.handle, bufs[i * part ..][0..len], i * part);
            try io.queue(&p.read);
        }
        try io.submit();
        for (&probes) |*p| try io.wait(&p.read);
        for (&probes, 0..) |*p, i| {
            try testing.expectEqual(Result.ok, p.read.result);
            try testing.expectEqual(@as(u32, 1), p.completions);
            try testing.expectEqualSlices(u8, data[i * part ..][0..p.read.buf.len], p.read.buf);
            const pooled = choice == .auto and i < 3;
            try testing.expectEqual(if (pooled) Kind.threads else Kind.io_uring, io.ranBy(&p.read));
        }
        // Behind a read in flight on the ring, a large resident read stays on the ring.
        // The read in flight is of an empty pipe, so it cannot finish before the check (a
        // file read could, and was reaped first on a fast machine).
        const pipe = try posix.pipe();
        defer for (pipe) |fd| posix.close(fd);
        var pending: Probe = .{};
        var small: [16]u8 = undefined;
        pending.read.prepare(pipe[0], &small, 0);
        try io.queue(&pending.read);
        errdefer if (pending.completions == 0) {
            // A failed check below: finish the pipe read before the ring goes.
            _ = posix.write(pipe[1], "0123456789abcdef") catch {};
            io.wait(&pending.read) catch {};
        };
        try io.submit();
        probes[0].read.prepare(file.handle, bufs[0..part], 0);
        try io.queue(&probes[0].read);
        try io.submit();
        try testing.expectEqual(Kind.io_uring, io.ranBy(&probes[0].read));
        try testing.expectEqual(small.len, try posix.write(pipe[1], "0123456789abcdef"));
        try io.wait(&pending.read);
        try io.wait(&probes[0].read);
        try testing.expectEqual(Result.ok, pending.read.result);
        try testing.expectEqualStrings("0123456789abcdef", &small);
        try testing.expectEqualSlices(u8, data[0..part], bufs[0..part]);
        // Taken back, wherever it went.
        probes[0].read.prepare(file.handle, bufs[0..part], 0);
        try io.queue(&probes[0].read);
        io.cancel(&probes[0].read);
        try testing.expect(probes[0].read.state.load(.acquire) != .queued);
    }
    // Out of the page cache (where the file system lets it go): the ring reads it.
    try posix.fdatasync(file.handle);
    _ = std.os.linux.fadvise(file.handle, 0, 0, std.os.linux.POSIX_FADV.DONTNEED);
    if (!files.rangeCached(file.handle, 0, part)) {
        var io = Io.init(.io_uring, 8, &rt.pool, .auto);
        defer io.deinit();
        var probe: Probe = .{};
        probe.read.prepare(file.handle, bufs[0..part], 0);
        try io.queue(&probe.read);
        try io.submit();
        try io.wait(&probe.read);
        try testing.expectEqual(Kind.io_uring, io.ranBy(&probe.read));
        try testing.expectEqualSlices(u8, data[0..part], bufs[0..part]);
    }
}
