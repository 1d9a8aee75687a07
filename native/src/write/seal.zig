//! Shard output with background sealing: the writer appends a shard's bytes on its own
//! thread (buffered, large appends straight from the caller's buffer); pool jobs read the
//! written bytes back from the page cache, hash them with SHA-256 as they arrive, start
//! their writeback early (`sync_file_range`), and once the writer closes the shard, fsync
//! and close it and record its digest. Several shards are hashed at once on different
//! threads, so hashing keeps up with writing on more than one core, and a shard's fsync
//! overlaps the writing of the next ones.
//!
//! Invariants:
//! - At most `slots.len` shards are unsealed at a time; opening one more waits (helping:
//!   the waiting thread hashes pending bytes itself, so a pool worker never blocks on jobs
//!   still queued behind it).
//! - Each shard is hashed exactly once, in file order, by one thread at a time (`busy`);
//!   a slot's job node is in the pool queue at most once (`queued`), and a slot is reused
//!   only when it is neither queued nor busy.
//! - Bytes are hashed only after `write` returned them: the digest is of the file's bytes.
//! - The first failure (read-back, writeback or fsync) is kept with its message and
//!   raised by the writer's next `check`; nothing is published after one.

const std = @import("std");
const mem_mod = @import("../base/mem.zig");
const linux = std.os.linux;
const status = @import("../base/status.zig");
const runtime_mod = @import("../base/runtime.zig");
const Sha256 = @import("../codec/sha256.zig").Sha256;

/// Bytes read back and hashed per read (stays in L2 between the copy and the hash).
const read_bytes = 256 << 10;
/// Written bytes that wait before a hash job is queued for them.
const step_bytes = 1 << 20;
/// Small appends are gathered up to this size before a write.
const buffer_bytes = 1 << 20;
/// Appends this large are written from the caller's buffer (after what is buffered).
const direct_bytes = 64 << 10;
/// Writeback is started after every this many hashed bytes.
const writeback_bytes = 8 << 20;

/// Totals of the sealing work (hashing, writeback, fsync), for the writer's profile.
pub const Stats = struct { calls: u64 = 0, total_ns: u64 = 0, bytes: u64 = 0 };

pub const Slot = struct {
    job: runtime_mod.Job = .{ .run = runJob },
    sealer: *Sealer = undefined,
    file: std.fs.File = undefined,
    /// The shard's path, for error messages.
    path: std.ArrayList(u8) = .empty,
    read_buf: []u8 = &.{},
    hasher: Sha256 = undefined,
    /// Shard id: its index in `Sealer.digests`.
    id: usize = 0,
    /// Writer thread only: bytes appended (buffered ones included).
    written: u64 = 0,
    /// Owned by the thread that is `busy` with the slot.
    synced: u64 = 0,
    // Under `Sealer.mutex`:
    state: State = .free,
    flushed: u64 = 0,
    hashed: u64 = 0,
    queued: bool = false,
    busy: bool = false,

    const State = enum { free, open, closed, done };

    fn pending(slot: *const Slot) bool {
        return (slot.state == .open or slot.state == .closed) and (slot.flushed > slot.hashed or slot.state == .closed);
    }

    fn runJob(job: *runtime_mod.Job) void {
        const slot: *Slot = @fieldParentPtr("job", job);
        const s = slot.sealer;
        s.mutex.lock();
        slot.queued = false;
        if (slot.busy or !slot.pending()) {
            s.cond.broadcast();
            s.mutex.unlock();
            return;
        }
        slot.busy = true;
        s.work(slot); // unlocks
    }
};

pub const Sealer = struct {
    gpa: std.mem.Allocator,
    pool: *runtime_mod.Pool,
    slots: []Slot,
    mutex: std.Thread.Mutex = .{},
    cond: std.Thread.Condition = .{},
    /// Digest of every shard opened so far, by id (filled in as shards are sealed).
    digests: std.ArrayList([32]u8) = .empty,
    /// The shard being written (writer thread only).
    current: ?*Slot = null,
    /// Writer thread only: gathered small appends of `current`.
    buffer: std.ArrayList(u8) = .empty,
    failure: ?status.Error = null,
    message: [status.message_bytes_max]u8 = undefined,
    message_len: usize = 0,
    profile: bool,
    stats: Stats = .{},

    /// `count` shards may be unsealed at once (at least 2).
    pub fn init(gpa: std.mem.Allocator, pool: *runtime_mod.Pool, count: usize, profile: bool) status.Error!*Sealer {
        const s = try gpa.create(Sealer);
        errdefer gpa.destroy(s);
        const slots = try gpa.alloc(Slot, @max(2, count));
        errdefer gpa.free(slots);
        @memset(slots, .{});
        var allocated: usize = 0;
        errdefer for (slots[0..allocated]) |*slot| mem_mod.freeUninit(gpa, slot.read_buf);
        for (slots) |*slot| {
            slot.read_buf = try mem_mod.allocUninit(gpa, read_bytes);
            slot.sealer = s;
            allocated += 1;
        }
        s.* = .{ .gpa = gpa, .pool = pool, .slots = slots, .profile = profile };
        return s;
    }

    /// Waits for every queued or running job (unless `forked`: no threads exist then),
    /// closes the files of unsealed shards and frees everything.
    pub fn deinit(s: *Sealer, forked: bool) void {
        if (!forked) s.quiesce();
        for (s.slots) |*slot| {
            if (slot.state == .open or slot.state == .closed) slot.file.close();
            slot.path.deinit(s.gpa);
            mem_mod.freeUninit(s.gpa, slot.read_buf);
        }
        s.gpa.free(s.slots);
        s.digests.deinit(s.gpa);
        s.buffer.deinit(s.gpa);
        s.gpa.destroy(s);
    }

    fn quiesce(s: *Sealer) void {
        s.mutex.lock();
        defer s.mutex.unlock();
        for (s.slots) |*slot| {
            if (slot.queued and s.pool.cancel(&slot.job)) slot.queued = false;
        }
        while (true) {
            var idle = true;
            for (s.slots) |*slot| idle = idle and !slot.queued and !slot.busy;
            if (idle) return;
            s.cond.wait(&s.mutex);
        }
    }

    /// Raises the first sealing failure, if any.
    pub fn check(s: *Sealer) status.Error!void {
        s.mutex.lock();
        defer s.mutex.unlock();
        if (s.failure) |err| return status.failText(err, s.message[0..s.message_len]);
    }

    /// Creates shard file `name` in `dir` (`path` names it in messages) as the next shard
    /// and makes it current. Waits (helping) while every slot is unsealed.
    pub fn open(s: *Sealer, dir: std.fs.Dir, name: []const u8, path: []const u8) status.Error!void {
        std.debug.assert(s.current == null);
        s.mutex.lock();
        const slot = s.acquireLocked() catch |err| {
            s.mutex.unlock();
            return err;
        };
        s.digests.append(s.gpa, undefined) catch {
            slot.state = .free;
            s.mutex.unlock();
            return status.fail(error.OutOfMemory, "out of memory", .{});
        };
        slot.id = s.digests.items.len - 1;
        s.mutex.unlock();
        errdefer {
            s.mutex.lock();
            slot.state = .free;
            _ = s.digests.pop();
            s.mutex.unlock();
        }
        slot.path.clearRetainingCapacity();
        try slot.path.appendSlice(s.gpa, path);
        slot.file = dir.createFile(name, .{ .exclusive = true, .read = true }) catch |err| return status.failIo(err, path);
        slot.hasher = .init();
        slot.written = 0;
        slot.synced = 0;
        s.buffer.clearRetainingCapacity();
        s.current = slot;
    }

    /// A slot that is free (or sealed and idle), marked open. Called locked.
    fn acquireLocked(s: *Sealer) status.Error!*Slot {
        while (true) {
            if (s.failure) |err| return status.failText(err, s.message[0..s.message_len]);
            for (s.slots) |*slot| {
                const reusable = slot.state == .free or (slot.state == .done and !slot.queued and !slot.busy);
                if (!reusable) continue;
                slot.state = .open;
                slot.flushed = 0;
                slot.hashed = 0;
                return slot;
            }
            if (!s.helpLocked()) s.cond.wait(&s.mutex);
        }
    }

    /// Runs one slot's pending hashing on this thread if a slot has some that no thread
    /// is doing (taking its job back from the queue). Called locked; returns locked.
    fn helpLocked(s: *Sealer) bool {
        for (s.slots) |*slot| {
            if (slot.busy or !slot.pending()) continue;
            if (slot.queued) {
                if (!s.pool.cancel(&slot.job)) continue; // a worker has it
                slot.queued = false;
            }
            slot.busy = true;
            s.work(slot);
            s.mutex.lock();
            return true;
        }
        return false;
    }

    /// Bytes in the current shard so far.
    pub fn written(s: *const Sealer) u64 {
        return s.current.?.written;
    }

    /// Appends `bytes` to the current shard.
    pub fn append(s: *Sealer, bytes: []const u8) status.Error!void {
        const slot = s.current.?;
        slot.written += bytes.len;
        if (bytes.len >= direct_bytes) {
            try s.flush();
            try s.writeOut(slot, bytes);
            return;
        }
        if (s.buffer.items.len + bytes.len > buffer_bytes) try s.flush();
        try s.buffer.appendSlice(s.gpa, bytes);
    }

    fn flush(s: *Sealer) status.Error!void {
        if (s.buffer.items.len == 0) return;
        try s.writeOut(s.current.?, s.buffer.items);
        s.buffer.clearRetainingCapacity();
    }

    fn writeOut(s: *Sealer, slot: *Slot, bytes: []const u8) status.Error!void {
        slot.file.writeAll(bytes) catch |err| return status.failIo(err, slot.path.items);
        s.mutex.lock();
        defer s.mutex.unlock();
        slot.flushed += bytes.len;
        if (slot.flushed - slot.hashed >= step_bytes) s.submitLocked(slot);
    }

    fn submitLocked(s: *Sealer, slot: *Slot) void {
        if (slot.queued or slot.busy or !slot.pending()) return;
        slot.queued = true;
        s.pool.submit(&slot.job);
    }

    /// Writes out the current shard and hands it over for sealing; returns its size.
    pub fn close(s: *Sealer) status.Error!u64 {
        const slot = s.current.?;
        try s.flush();
        s.current = null;
        s.mutex.lock();
        defer s.mutex.unlock();
        slot.state = .closed;
        s.submitLocked(slot);
        return slot.written;
    }

    /// Waits (helping) until every closed shard is sealed, then raises any failure. The
    /// digests are then final.
    pub fn wait(s: *Sealer) status.Error!void {
        std.debug.assert(s.current == null);
        s.mutex.lock();
        defer s.mutex.unlock();
        while (true) {
            var sealing = false;
            for (s.slots) |*slot| sealing = sealing or slot.state == .closed or slot.busy or slot.queued;
            if (!sealing) break;
            if (!s.helpLocked()) s.cond.wait(&s.mutex);
        }
        if (s.failure) |err| return status.failText(err, s.message[0..s.message_len]);
    }

    /// Hashes the slot's written bytes until none are left, and seals it once closed.
    /// Called locked with `busy` set by the caller; returns unlocked, `busy` cleared.
    fn work(s: *Sealer, slot: *Slot) void {
        while (true) {
            const from = slot.hashed;
            const to = slot.flushed;
            const closed = slot.state == .closed;
            const failed = s.failure != null;
            if (failed or from == to) {
                // After a failure an open shard stays with the writer (its file open).
                if (closed) {
                    s.mutex.unlock();
                    const result = if (failed) null else s.seal(slot);
                    s.mutex.lock();
                    if (result) |digest| {
                        s.digests.items[slot.id] = digest;
                    } else {
                        slot.file.close(); // seal closed it on success
                    }
                    slot.state = .done;
                }
                slot.busy = false;
                s.cond.broadcast();
                s.mutex.unlock();
                return;
            }
            s.mutex.unlock();
            const ok = s.hashRange(slot, from, to);
            s.mutex.lock();
            if (ok) slot.hashed = to;
        }
    }

    /// Reads [from, to) back and hashes it; starts writeback every writeback_bytes.
    /// Returns false after recording a failure.
    fn hashRange(s: *Sealer, slot: *Slot, from: u64, to: u64) bool {
        const started = if (s.profile) std.time.nanoTimestamp() else 0;
        var at = from;
        while (at < to) {
            const want: usize = @intCast(@min(to - at, slot.read_buf.len));
            const n = slot.file.preadAll(slot.read_buf[0..want], at) catch |err| {
                s.recordFailure(status.failIo(err, slot.path.items));
                return false;
            };
            if (n != want) {
                s.recordFailure(status.fail(error.Io, "I/O error: shard shorter than written: {s}", .{slot.path.items}));
                return false;
            }
            slot.hasher.update(slot.read_buf[0..n]);
            at += n;
        }
        if (to - slot.synced >= writeback_bytes) {
            startWriteback(slot.file, slot.synced, to - slot.synced);
            slot.synced = to;
        }
        s.addStats(started, to - from);
        return true;
    }

    /// Fsyncs and closes the slot's file; returns its digest, or null after recording a
    /// failure (the file still open).
    fn seal(s: *Sealer, slot: *Slot) ?[32]u8 {
        const started = if (s.profile) std.time.nanoTimestamp() else 0;
        slot.file.sync() catch |err| {
            s.recordFailure(status.failIo(err, slot.path.items));
            return null;
        };
        slot.file.close();
        s.addStats(started, 0);
        return slot.hasher.finalResult();
    }

    fn addStats(s: *Sealer, started: i128, bytes: u64) void {
        if (!s.profile) return;
        const ns: u64 = @intCast(@max(0, std.time.nanoTimestamp() - started));
        s.mutex.lock();
        defer s.mutex.unlock();
        s.stats.calls += 1;
        s.stats.total_ns += ns;
        s.stats.bytes += bytes;
    }

    /// Keeps the first failure and this thread's message for it.
    fn recordFailure(s: *Sealer, err: status.Error) void {
        s.mutex.lock();
        defer s.mutex.unlock();
        if (s.failure != null) return;
        const msg = status.lastMessage();
        const len = @min(msg.len, s.message.len);
        @memcpy(s.message[0..len], msg[0..len]);
        s.message_len = len;
        s.failure = err;
    }
};

/// Asks the kernel to start writing [offset, offset + len) back now (not waiting for it),
/// so the final fsync has little left to do. Advisory: errors surface at fsync.
fn startWriteback(file: std.fs.File, offset: u64, len: u64) void {
    if (!@hasField(linux.SYS, "sync_file_range") or @sizeOf(usize) != 8) return;
    const write_flag: usize = 2; // SYNC_FILE_RANGE_WRITE
    _ = linux.syscall4(.sync_file_range, @bitCast(@as(isize, file.handle)), @intCast(offset), @intCast(len), write_flag);
}

// ---------------------------------------------------------------- tests

const testing = std.testing;

fn expectFile(dir: std.fs.Dir, name: []const u8, bytes: []const u8, digest: [32]u8) !void {
    const got = try dir.readFileAlloc(testing.allocator, name, 1 << 26);
    defer testing.allocator.free(got);
    try testing.expectEqualSlices(u8, bytes, got);
    var want: [32]u8 = undefined;
    Sha256.hash(bytes, &want);
    try testing.expectEqualSlices(u8, &want, &digest);
}

test "sealer: shards of small and large appends hash to their files' bytes, on any worker count" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const data = try gpa.alloc(u8, 9 << 20);
    defer gpa.free(data);
    var prng = std.Random.DefaultPrng.init(7);
    prng.random().bytes(data);
    for ([_]usize{ 1, 2, 3 }) |workers| {
        const rt = try runtime_mod.Runtime.open(gpa, workers);
        defer rt.release();
        // Two slots, many shards: opening waits for (and helps) earlier seals.
        const s = try Sealer.init(gpa, &rt.pool, 2, true);
        defer s.deinit(false);
        var names: [7][16]u8 = undefined;
        var name_lens: [7]usize = undefined;
        const bounds: [8]usize = .{ 0, 1, 70_000, (3 << 20) + 5, 4 << 20, (6 << 20) + 3, (6 << 20) + 4, 9 << 20 };
        for (0..7) |i| {
            const name = try std.fmt.bufPrint(&names[i], "s{d}-{d}.bin", .{ workers, i });
            name_lens[i] = name.len;
            try s.open(tmp.dir, name, name);
            var at = bounds[i];
            // Alternate small and large appends.
            var size: usize = 100;
            while (at < bounds[i + 1]) {
                const n = @min(size, bounds[i + 1] - at);
                try s.append(data[at..][0..n]);
                at += n;
                size = if (size == 100) 300_000 else 100;
            }
            try testing.expectEqual(@as(u64, bounds[i + 1] - bounds[i]), try s.close());
        }
        try s.wait();
        try testing.expectEqual(@as(usize, 7), s.digests.items.len);
        for (0..7) |i| {
            try expectFile(tmp.dir, names[i][0..name_lens[i]], data[bounds[i]..bounds[i + 1]], s.digests.items[i]);
        }
        try testing.expect(s.stats.bytes == 9 << 20);
    }
}

test "sealer: an unsealed shard is closed and waited for on deinit; a failure is raised by check and wait" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const rt = try runtime_mod.Runtime.open(gpa, 1);
    defer rt.release();
    {
        const s = try Sealer.init(gpa, &rt.pool, 2, false);
        defer s.deinit(false);
        try s.open(tmp.dir, "a.bin", "a.bin");
        try s.append(&([_]u8{1} ** 5000));
        _ = try s.close();
        try s.open(tmp.dir, "b.bin", "b.bin");
        try s.append(&([_]u8{2} ** (2 << 20)));
    }
    {
        const s = try Sealer.init(gpa, &rt.pool, 2, false);
        defer s.deinit(false);
        // A file that cannot be created is this call's error; an existing name too.
        try testing.expectError(error.Io, s.open(tmp.dir, "a.bin", "/x/a.bin"));
        try testing.expect(std.mem.endsWith(u8, status.lastMessage(), "/x/a.bin"));
        try testing.expectEqual(@as(usize, 0), s.digests.items.len);
        s.recordFailure(status.fail(error.Io, "I/O error: disk gone: {s}", .{"x.bin"}));
        try testing.expectError(error.Io, s.check());
        try testing.expectEqualStrings("I/O error: disk gone: x.bin", status.lastMessage());
        try testing.expectError(error.Io, s.open(tmp.dir, "c.bin", "c.bin"));
        try testing.expectError(error.Io, s.wait());
    }
}
