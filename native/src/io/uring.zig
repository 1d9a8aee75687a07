//! The io_uring layer of the reader: a small wrapper over std's IoUring that exposes
//! only what the prefetch pipeline needs (queue a positioned read, submit, reap), plus a
//! runtime `available` probe. Everything that churns between Zig versions or kernels
//! stays in this file; the reader falls back to the thread pool when `init` fails
//! (ENOSYS on old kernels, EPERM under seccomp, ENOMEM from locked-memory limits).

const std = @import("std");
const linux = std.os.linux;
const posix = std.posix;

pub const Completion = struct {
    user_data: u64,
    /// Bytes transferred, or a negative errno.
    res: i32,
};

pub const Ring = struct {
    ring: linux.IoUring,
    /// Submissions queued or in flight (bounded by the ring size by the caller).
    in_flight: u32 = 0,

    /// Creates a ring with at least `entries` submission slots (rounded up to a power of two).
    pub fn init(entries: u32) error{Unavailable}!Ring {
        const n = std.math.ceilPowerOfTwo(u32, @max(entries, 1)) catch return error.Unavailable;
        const ring = linux.IoUring.init(@intCast(@min(n, 4096)), 0) catch return error.Unavailable;
        return .{ .ring = ring };
    }

    pub fn deinit(r: *Ring) void {
        r.ring.deinit();
    }

    /// Whether this process may use io_uring at all (kernel support, seccomp, limits).
    pub fn available() bool {
        var r = init(2) catch return false;
        r.deinit();
        return true;
    }

    pub fn capacity(r: *const Ring) u32 {
        return r.ring.sq.sqes.len;
    }

    /// Queues a positioned read of `buf.len` bytes at `offset` (not yet submitted).
    pub fn queueRead(r: *Ring, user_data: u64, fd: posix.fd_t, buf: []u8, offset: u64) error{Full}!void {
        _ = r.ring.read(user_data, fd, .{ .buffer = buf }, offset) catch return error.Full;
        r.in_flight += 1;
    }

    /// Submits everything queued; with `wait` > 0 also waits for that many completions.
    pub fn submit(r: *Ring, wait: u32) !void {
        while (true) {
            _ = r.ring.submit_and_wait(wait) catch |err| switch (err) {
                error.SignalInterrupt => continue,
                else => return err,
            };
            return;
        }
    }

    /// Copies up to out.len ready completions, waiting for at least `wait` of them.
    pub fn reap(r: *Ring, out: []Completion, wait: u32) !usize {
        var cqes: [64]linux.io_uring_cqe = undefined;
        const want = @min(out.len, cqes.len);
        const n = while (true) {
            break r.ring.copy_cqes(cqes[0..want], wait) catch |err| switch (err) {
                error.SignalInterrupt => continue,
                else => return err,
            };
        };
        for (cqes[0..n], out[0..n]) |cqe, *c| c.* = .{ .user_data = cqe.user_data, .res = cqe.res };
        r.in_flight -= n;
        return n;
    }
};

test "read a file through the ring" {
    if (!Ring.available()) return error.SkipZigTest;
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    try tmp.dir.writeFile(.{ .sub_path = "f", .data = "hello io_uring" });
    const file = try tmp.dir.openFile("f", .{});
    defer file.close();
    var r = try Ring.init(4);
    defer r.deinit();
    var buf: [8]u8 = undefined;
    try r.queueRead(7, file.handle, &buf, 6);
    try r.submit(1);
    var out: [4]Completion = undefined;
    const n = try r.reap(&out, 1);
    try std.testing.expectEqual(@as(usize, 1), n);
    try std.testing.expectEqual(@as(u64, 7), out[0].user_data);
    try std.testing.expectEqual(@as(i32, 8), out[0].res);
    try std.testing.expectEqualStrings("io_uring", &buf);
}
