//! Runs of adjacent records read ahead on the runtime's worker pool, for ordered
//! contiguous batches of small records (`Iter.takeAdjacent`). The consumer plans the next
//! runs from index rows alone and hands their reads to the pool before it splits and
//! copies the run in hand, so the kernel's copy out of the page cache runs on another
//! core, on either I/O backend, also while the caller works on the batch it was given.
//!
//! These reads only ever copy bytes that are in the page cache (`files.readResident`): a
//! range that is not comes back refused, and the iterator reads it its usual way (with
//! many reads in flight). A read the pool has not started when the consumer needs it is
//! taken back and run on the consumer's thread (no wait behind other jobs, no wake-up).
//!
//! Bounded: `depth` runs of at most `bytes_max` bytes and `records_max` records, their
//! buffers allocated once by `init` (uninitialized: every byte is read into before it
//! is used, and a safety-checked build's fill of a fresh buffer would touch all of it).
//!
//! Invariants:
//! - The ring holds runs in plan order, each starting where the previous one ends.
//! - A queued run's buffer and its pinned descriptor belong to the pool job until the job
//!   is done; `clear` and `deinit` take back jobs not started and wait for running ones,
//!   so no worker writes a buffer after they return.

const std = @import("std");
const mem_mod = @import("../base/mem.zig");
const runtime = @import("../base/runtime.zig");
const status = @import("../base/status.zig");
const files_mod = @import("../io/files.zig");
const shard = @import("../format/shard.zig");

/// One run: `len` bytes at `offset` of shard `key`, the records of `count` consecutive
/// plan indexes from `first`, whose first record is sample `sample_id` of cache
/// `key.cache` (the others follow it).
pub const Run = struct {
    key: files_mod.Key,
    offset: u64,
    len: u64,
    first: u64,
    sample_id: u64,
    count: usize,

    /// The plan index just past the run.
    pub fn end(r: Run) u64 {
        return r.first + r.count;
    }
};

/// `shard.payloadOffset` of records lying back to back in `bytes`, of lengths `lens`:
/// writes where each payload starts (`bytes[starts[i] .. end of record i]`) up to the
/// first record that does not split (or does not fit in `bytes`), and returns how many
/// split.
pub fn splitRun(bytes: []const u8, lens: []const u64, starts: []u32) usize {
    std.debug.assert(starts.len >= lens.len and bytes.len <= std.math.maxInt(u32));
    var at: usize = 0;
    for (lens, 0..) |len64, i| {
        if (len64 > bytes.len - at) return i;
        const len: usize = @intCast(len64);
        const offset = shard.payloadOffset(bytes[at..][0..len]) orelse return i;
        starts[i] = @intCast(at + offset);
        at += len;
    }
    return lens.len;
}

pub const Slot = struct {
    task: runtime.Task = .init(runJob),
    /// The shard's descriptor, pinned while the slot holds a run.
    handle: ?files_mod.Files.Handle = null,
    run: Run = undefined,
    /// The run's bytes (`run.len` of them once read) and its records' lengths.
    buf: []u8,
    lens: []u64,
    /// Set by the read: every byte was in the page cache and was read.
    resident: bool = false,
    /// Set by the read (`splitRun`, while the bytes are in the reading core's caches):
    /// where the first `split` records' payloads start in `buf`.
    starts: []u32,
    split: usize = 0,

    fn read(s: *Slot) void {
        const buf = s.buf[0..@intCast(s.run.len)];
        s.resident = files_mod.readResident(s.handle.?.fd, buf, s.run.offset);
        s.split = if (s.resident) splitRun(buf, s.lens[0..s.run.count], s.starts) else 0;
    }

    fn runJob(job: *runtime.Job) void {
        const task: *runtime.Task = @fieldParentPtr("job", job);
        const s: *Slot = @fieldParentPtr("task", task);
        s.read();
        task.finish();
    }

    /// The run's bytes once its read is done (run here if the pool has not started it),
    /// or null when they were not all in the page cache.
    pub fn bytes(s: *Slot, pool: *runtime.Pool) ?[]const u8 {
        if (s.task.takeBack(pool)) s.read();
        return if (s.resident) s.buf[0..@intCast(s.run.len)] else null;
    }
};

pub const Ring = struct {
    slots: []Slot = &.{},
    head: usize = 0,
    count: usize = 0,
    /// Records (and their bytes) of the oldest run already taken (`take`).
    taken: usize = 0,
    taken_bytes: u64 = 0,
    /// Runs handed to the pool so far (tests check the read-ahead ran).
    queued_runs: u64 = 0,

    /// `depth` slots with buffers of `bytes_max` bytes and `records_max` lengths.
    pub fn init(gpa: std.mem.Allocator, depth: usize, bytes_max: usize, records_max: usize) error{OutOfMemory}!Ring {
        const slots = try gpa.alloc(Slot, depth);
        var made: usize = 0;
        errdefer {
            for (slots[0..made]) |s| {
                mem_mod.freeUninit(gpa, s.buf);
                gpa.free(s.lens);
                gpa.free(s.starts);
            }
            gpa.free(slots);
        }
        while (made < depth) : (made += 1) {
            const buf = try mem_mod.allocUninit(gpa, bytes_max);
            errdefer mem_mod.freeUninit(gpa, buf);
            const lens = try gpa.alloc(u64, records_max);
            errdefer gpa.free(lens);
            slots[made] = .{ .buf = buf, .lens = lens, .starts = try gpa.alloc(u32, records_max) };
        }
        return .{ .slots = slots };
    }

    /// Precondition: `clear` ran (nothing queued, nothing pinned).
    pub fn deinit(r: *Ring, gpa: std.mem.Allocator) void {
        std.debug.assert(r.count == 0);
        for (r.slots) |s| {
            mem_mod.freeUninit(gpa, s.buf);
            gpa.free(s.lens);
            gpa.free(s.starts);
        }
        gpa.free(r.slots);
        r.* = .{};
    }

    /// The oldest run, if any.
    pub fn front(r: *Ring) ?*Slot {
        return if (r.count == 0) null else &r.slots[r.head];
    }

    /// The plan index just past the newest run, if any.
    pub fn end(r: *const Ring) ?u64 {
        if (r.count == 0) return null;
        return r.slots[(r.head + r.count - 1) % r.slots.len].run.end();
    }

    /// The slot the next run goes to (its `lens` to be filled), or null when all are taken.
    pub fn next(r: *Ring) ?*Slot {
        if (r.count == r.slots.len) return null;
        return &r.slots[(r.head + r.count) % r.slots.len];
    }

    /// Queues `run` (with `next().lens` filled) on `pool`, its shard's descriptor pinned.
    /// Returns false when the descriptor cannot be had (nothing queued).
    pub fn push(r: *Ring, pool: *runtime.Pool, files: *files_mod.Files, opener: anytype, run: Run) bool {
        std.debug.assert(run.len > 0 and run.count > 0);
        const s = r.next().?;
        std.debug.assert(s.task.is(runtime.Task.idle) and s.handle == null);
        std.debug.assert(run.len <= s.buf.len and run.count <= s.lens.len);
        if (r.end()) |e| std.debug.assert(run.first == e);
        s.handle = (files.acquireWithin(run.key, opener) catch return false) orelse return false;
        s.run = run;
        s.resident = false;
        r.count += 1;
        r.queued_runs += 1;
        s.task.submit(pool);
        return true;
    }

    /// Marks the next `records` records (`bytes` bytes) of the oldest run taken (its
    /// read done: `Slot.bytes` returned), and drops the run once all of them are.
    pub fn take(r: *Ring, files: *files_mod.Files, records: usize, bytes: u64) void {
        const s = r.front().?;
        std.debug.assert(s.task.is(runtime.Task.done) and r.taken + records <= s.run.count);
        r.taken += records;
        r.taken_bytes += bytes;
        if (r.taken < s.run.count) return;
        release(s, files);
        r.head = (r.head + 1) % r.slots.len;
        r.count -= 1;
        r.taken = 0;
        r.taken_bytes = 0;
    }

    /// Drops every run: jobs not started are taken back, running ones waited for.
    pub fn clear(r: *Ring, pool: *runtime.Pool, files: *files_mod.Files) void {
        while (r.front()) |s| {
            // Taken back: its bytes are never used.
            _ = s.task.takeBack(pool);
            release(s, files);
            r.head = (r.head + 1) % r.slots.len;
            r.count -= 1;
        }
        r.head = 0;
        r.taken = 0;
        r.taken_bytes = 0;
    }

    fn release(s: *Slot, files: *files_mod.Files) void {
        if (s.handle) |h| files.release(h);
        s.handle = null;
        s.task.reset();
    }
};

/// A contiguous batch read ahead straight into the caller's memory (`Iter.stageBatch`):
/// runs of adjacent records (planned by the consumer from index rows) placed one after
/// the other by one pool job in `dest`, each record's payload right after the payloads
/// before it (its header and JSON dropped). A run of a shard the dataset keeps mapped
/// (`files.ShardMaps`) has each payload copied straight out of the mapping; any other is
/// read into `dest` at the end of the payloads before it and compacted there (each
/// payload moved down over its header and JSON) while the run is in the reading core's
/// caches. The payloads then lie back to back from `dest[0]` as the batch wants them: the
/// consumer only records where they are (no copy on its thread). Only bytes in the page
/// cache are copied (`files.mappedResident`, `files.readResident`); the job stops at the
/// first run that is not, or at the first record that does not split, leaving the rest
/// of the batch to the usual paths (which read it again and meet its errors).
///
/// Bounded: the run list and lengths hold at most the staged batch's records (its
/// `max_count`), reused from batch to batch; the bytes are the caller's.
///
/// Invariants: while `active`, the job owns `dest`, `runs`, `lens`, `sources` and
/// `placed_lens` until `settle` returns; each source's handle pins its run's shard
/// descriptor until `release`; a mapping outlives the job (the dataset's).
pub const Fill = struct {
    task: runtime.Task = .init(runJob),
    active: bool = false,
    /// The caller's memory, and the plan index of the batch's first sample.
    dest: []u8 = &.{},
    first: u64 = 0,
    /// The batch's size, and whether the runs cover all of it (the next batch starts
    /// at `first + max_count`).
    max_count: u64 = 0,
    whole: bool = false,
    /// The runs in plan order (each continuing the previous one), their records'
    /// lengths back to back, and where each run's bytes come from.
    runs: std.ArrayList(Run) = .empty,
    lens: std.ArrayList(u64) = .empty,
    sources: std.ArrayList(Source) = .empty,
    /// Set by the job: the payload length of each record it placed (a prefix of the
    /// runs' records: `placed` of them, `placed_bytes` in all from `dest[0]`).
    placed_lens: []u64 = &.{},
    placed: usize = 0,
    placed_bytes: usize = 0,

    pub fn deinit(f: *Fill, gpa: std.mem.Allocator) void {
        std.debug.assert(!f.active);
        f.runs.deinit(gpa);
        f.lens.deinit(gpa);
        f.sources.deinit(gpa);
        gpa.free(f.placed_lens);
        f.* = .{};
    }

    /// Empties the run list for planning a new batch (`add`), with room for `records`
    /// lengths (`add`'s `lens` come from `lensRoom`). Pre: not active.
    pub fn begin(f: *Fill, gpa: std.mem.Allocator, records: usize) error{OutOfMemory}!void {
        std.debug.assert(!f.active);
        f.runs.clearRetainingCapacity();
        f.lens.clearRetainingCapacity();
        f.sources.clearRetainingCapacity();
        try f.lens.ensureTotalCapacity(gpa, records);
        if (f.placed_lens.len < records) {
            gpa.free(f.placed_lens);
            f.placed_lens = &.{};
            f.placed_lens = try gpa.alloc(u64, records);
        }
    }

    /// Where the next run's record lengths go (`records` of room at most).
    pub fn lensRoom(f: *Fill) []u64 {
        return f.lens.unusedCapacitySlice();
    }

    /// A run's shard: its pinned descriptor, and its whole mapping when the dataset keeps
    /// one (`files.ShardMaps`).
    pub const Source = struct {
        handle: files_mod.Files.Handle,
        mapping: ?[]const u8 = null,
    };

    /// Appends `run` (its lengths written to `lensRoom()[0..run.count]`) with its
    /// shard's source.
    pub fn add(f: *Fill, gpa: std.mem.Allocator, run: Run, source: Source) error{OutOfMemory}!void {
        std.debug.assert(run.count <= f.lensRoom().len);
        if (f.runs.items.len > 0) std.debug.assert(run.first == f.runs.items[f.runs.items.len - 1].end());
        try f.runs.ensureUnusedCapacity(gpa, 1);
        try f.sources.ensureUnusedCapacity(gpa, 1);
        f.runs.appendAssumeCapacity(run);
        f.sources.appendAssumeCapacity(source);
        f.lens.items.len += run.count;
    }

    /// Bytes of the runs added so far (the memory the job needs).
    pub fn bytes(f: *const Fill) u64 {
        var total: u64 = 0;
        for (f.runs.items) |r| total += r.len;
        return total;
    }

    /// Starts the job reading the runs into `dest` for the batch from plan index
    /// `first`. Pre: at least one run, `bytes() <= dest.len`.
    pub fn start(f: *Fill, pool: *runtime.Pool, dest: []u8, first: u64, max_count: u64, whole: bool) void {
        std.debug.assert(!f.active and f.runs.items.len > 0 and f.bytes() <= dest.len);
        f.dest = dest;
        f.first = first;
        f.max_count = max_count;
        f.whole = whole;
        f.placed = 0;
        f.placed_bytes = 0;
        f.active = true;
        f.task.reset();
        f.task.submit(pool);
    }

    /// Waits until the job is done (run here if the pool has not started it): then
    /// `placed`, `placed_lens` and `placed_bytes` are set and the job no longer writes
    /// `dest`. Pre: active.
    pub fn settle(f: *Fill, pool: *runtime.Pool) void {
        std.debug.assert(f.active);
        if (f.task.takeBack(pool)) f.fill();
    }

    /// Settles the job and unpins the descriptors; the staged batch is dropped.
    pub fn release(f: *Fill, pool: *runtime.Pool, files: *files_mod.Files) void {
        if (!f.active) return;
        f.settle(pool);
        f.unpin(files);
        f.active = false;
        f.dest = &.{};
    }

    /// Unpins the runs' descriptors (of runs planned but not started, or released).
    pub fn unpin(f: *Fill, files: *files_mod.Files) void {
        std.debug.assert(!f.active or f.task.is(runtime.Task.done));
        for (f.sources.items) |src| files.release(src.handle);
        f.sources.clearRetainingCapacity();
    }

    fn runJob(job: *runtime.Job) void {
        const task: *runtime.Task = @fieldParentPtr("job", job);
        const f: *Fill = @fieldParentPtr("task", task);
        f.fill();
        task.finish();
    }

    /// Bytes `[start, end)` of shard `key` known to be in the page cache (`fill`).
    const Resident = struct { key: ?files_mod.Key = null, start: u64 = 0, end: u64 = 0 };

    /// Run `i`'s shard mapping, when it has one and the run's bytes are in the page
    /// cache: checked once for it and the runs of its shard that follow it back to back
    /// (remembered in `resident`).
    fn residentMapping(f: *const Fill, i: usize, resident: *Resident) ?[]const u8 {
        const run = f.runs.items[i];
        const src = f.sources.items[i];
        const mapping = src.mapping orelse return null;
        if (resident.key) |key| {
            if (std.meta.eql(key, run.key) and run.offset >= resident.start and run.offset + run.len <= resident.end) return mapping;
        }
        var end = run.offset + run.len;
        for (f.runs.items[i + 1 ..]) |next| {
            if (!std.meta.eql(next.key, run.key) or next.offset != end) break;
            end += next.len;
        }
        if (!files_mod.mappedResident(src.handle.fd, mapping, run.offset, end - run.offset)) return null;
        resident.* = .{ .key = run.key, .start = run.offset, .end = end };
        return mapping;
    }

    fn fill(f: *Fill) void {
        var to: usize = 0; // payload bytes placed so far
        var placed: usize = 0;
        var record: usize = 0; // index of the run's first record in `lens`
        var resident: Resident = .{};
        runs: for (f.runs.items, f.sources.items, 0..) |run, src, i| {
            const len: usize = @intCast(run.len);
            // Fits: `start` checked that all runs do, and the payloads before take less.
            std.debug.assert(len <= f.dest.len - to);
            // The run's records: in its shard's mapping, or read into `dest` right after
            // the payloads before.
            const from: []const u8, var at: usize = if (f.residentMapping(i, &resident)) |mapping|
                .{ mapping, @intCast(run.offset) }
            else blk: {
                if (!files_mod.readResident(src.handle.fd, f.dest[to..][0..len], run.offset)) break :runs;
                break :blk .{ f.dest, to };
            };
            for (f.lens.items[record..][0..run.count]) |record_len64| {
                const record_len: usize = @intCast(record_len64);
                const offset = shard.payloadOffset(from[at..][0..record_len]) orelse break :runs;
                const n = record_len - offset;
                // Out of the mapping, or down over the headers and JSON before it in
                // `dest` (`to <= at`).
                @memmove(f.dest[to..][0..n], from[at + offset ..][0..n]);
                f.placed_lens[placed] = n;
                placed += 1;
                to += n;
                at += record_len;
            }
            record += run.count;
        }
        f.placed = placed;
        f.placed_bytes = to;
    }
};

// ---------------------------------------------------------------- tests

const testing = std.testing;

/// Opens `path` in the test's directory (`Files.acquire`'s opener).
const TestOpener = struct {
    dir: std.fs.Dir,
    pub fn open(o: TestOpener, key: files_mod.Key) status.Error!std.posix.fd_t {
        _ = key;
        const f = o.dir.openFile("shard", .{}) catch return error.Io;
        return f.handle;
    }
};

test "Ring reads runs ahead on the pool, in order, and takes back what it does not use" {
    const rt = try runtime.Runtime.open(testing.allocator, 2);
    defer rt.release();
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var data: [4096]u8 = undefined;
    for (&data, 0..) |*b, i| b.* = @truncate(i *% 7);
    try tmp.dir.writeFile(.{ .sub_path = "shard", .data = &data });
    var files: files_mod.Files = .{};
    defer files.deinit();
    const opener: TestOpener = .{ .dir = tmp.dir };

    var ring = try Ring.init(testing.allocator, 3, 1024, 4);
    defer ring.deinit(testing.allocator);
    try testing.expect(ring.front() == null and ring.end() == null);
    // Three runs of 1000 bytes; a fourth finds no slot.
    var first: u64 = 0;
    for (0..3) |k| {
        const s = ring.next().?;
        s.lens[0] = 1000;
        try testing.expect(ring.push(&rt.pool, &files, opener, .{ .key = .{ .cache = 0, .shard_id = 0 }, .offset = k * 1000, .len = 1000, .first = first, .sample_id = first, .count = 1 }));
        first += 1;
    }
    try testing.expect(ring.next() == null);
    try testing.expectEqual(@as(?u64, 3), ring.end());
    // Just written: in the page cache (a kernel without RWF_NOWAIT for buffered reads
    // refuses the reads, which is allowed: then no bytes are handed out).
    for (0..2) |k| {
        const s = ring.front().?;
        if (s.bytes(&rt.pool)) |b| {
            try testing.expectEqualSlices(u8, data[k * 1000 ..][0..1000], b);
            // Split by the read: these bytes' first 8, read as a JSON length, are past
            // the record, so none of its one record splits.
            try testing.expectEqual(@as(usize, 0), s.split);
        }
        // Taken in two pieces: the run stays the oldest until both are.
        ring.take(&files, 0, 400);
        try testing.expectEqual(s, ring.front().?);
        ring.take(&files, 1, 600);
    }
    // A run past the end of the file is refused.
    const s = ring.next().?;
    s.lens[0] = 1000;
    try testing.expect(ring.push(&rt.pool, &files, opener, .{ .key = .{ .cache = 0, .shard_id = 0 }, .offset = 3500, .len = 1000, .first = 3, .sample_id = 3, .count = 1 }));
    {
        const third = ring.front().?;
        _ = third.bytes(&rt.pool);
        ring.take(&files, 1, 1000);
        try testing.expect(ring.front().?.bytes(&rt.pool) == null);
    }
    // The last run, read or not, is taken back; the ring is usable again.
    ring.clear(&rt.pool, &files);
    try testing.expect(ring.front() == null and ring.end() == null);
    try testing.expectEqual(@as(u64, 4), ring.queued_runs);
}

test "splitRun finds each payload and stops at the first record that does not split" {
    // Three records back to back: header (json_len), JSON, payload.
    var bytes: [64]u8 = undefined;
    @memset(&bytes, 0xee);
    const records = [_]struct { json: u64, len: u64 }{ .{ .json = 2, .len = 14 }, .{ .json = 0, .len = 8 }, .{ .json = 5, .len = 20 } };
    var at: usize = 0;
    var lens: [records.len]u64 = undefined;
    for (records, &lens) |r, *len| {
        std.mem.writeInt(u64, bytes[at..][0..8], r.json, .little);
        len.* = r.len;
        at += @intCast(r.len);
    }
    var starts: [4]u32 = undefined;
    try testing.expectEqual(@as(usize, 3), splitRun(bytes[0..at], &lens, &starts));
    try testing.expectEqualSlices(u32, &.{ 10, 22, 35 }, starts[0..3]);
    // A JSON length past its record, a record shorter than a header, and a record past
    // the bytes each end the run there.
    std.mem.writeInt(u64, bytes[14..][0..8], 1, .little);
    try testing.expectEqual(@as(usize, 1), splitRun(bytes[0..at], &lens, &starts));
    std.mem.writeInt(u64, bytes[14..][0..8], 0, .little);
    try testing.expectEqual(@as(usize, 2), splitRun(bytes[0..at], &.{ 14, 8, 7 }, &starts));
    try testing.expectEqual(@as(usize, 2), splitRun(bytes[0 .. at - 1], &lens, &starts));
    try testing.expectEqual(@as(usize, 0), splitRun(bytes[0..0], &.{}, &starts));
}

test "Fill places runs in the caller's memory (read, or copied out of the mapping) with the payloads back to back, stopping where a run or record fails" {
    const rt = try runtime.Runtime.open(testing.allocator, 2);
    defer rt.release();
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    // Four records: header (JSON length), JSON, payload; the third's JSON length is
    // past its record.
    const records = [_]struct { json: []const u8, payload: []const u8 }{
        .{ .json = "{}", .payload = "abcd" },
        .{ .json = "", .payload = "efghij" },
        .{ .json = "{\"a\":1}", .payload = "k" },
        .{ .json = "{}", .payload = "lmno" },
    };
    var file: [256]u8 = undefined;
    var lens: [records.len]u64 = undefined;
    var at: usize = 0;
    for (records, &lens, 0..) |r, *len, i| {
        std.mem.writeInt(u64, file[at..][0..8], if (i == 2) 1000 else r.json.len, .little);
        @memcpy(file[at + 8 ..][0..r.json.len], r.json);
        @memcpy(file[at + 8 + r.json.len ..][0..r.payload.len], r.payload);
        len.* = 8 + r.json.len + r.payload.len;
        at += @intCast(len.*);
    }
    try tmp.dir.writeFile(.{ .sub_path = "shard", .data = file[0..at] });
    var files: files_mod.Files = .{};
    defer files.deinit();
    const opener: TestOpener = .{ .dir = tmp.dir };
    const key: files_mod.Key = .{ .cache = 0, .shard_id = 0 };
    var maps: files_mod.ShardMaps = .{};
    defer maps.deinit(testing.allocator);
    var fill: Fill = .{};
    defer fill.deinit(testing.allocator);
    var dest: [256]u8 = undefined;
    // Runs {0, 1} and {2, 3} (stopping at record 2), then {0} and {1} in memory just as
    // long as the records; each run read, or copied out of the shard's mapping (`mapped`:
    // a bit per run), or some of each.
    const plans = [_]struct { runs: []const [2]usize, placed: []const u8 }{
        .{ .runs = &.{ .{ 0, 2 }, .{ 2, 4 } }, .placed = "abcdefghij" },
        .{ .runs = &.{ .{ 0, 1 }, .{ 1, 2 } }, .placed = "abcdefghij" },
    };
    for (plans) |plan| for (0..4) |mapped| {
        try fill.begin(testing.allocator, 8);
        for (plan.runs, 0..) |r, i| {
            var offset: u64 = 0;
            for (lens[0..r[0]]) |len| offset += len;
            var len: u64 = 0;
            for (lens[r[0]..r[1]], fill.lensRoom()[0 .. r[1] - r[0]]) |l, *out| {
                out.* = l;
                len += l;
            }
            const run: Run = .{ .key = key, .offset = offset, .len = len, .first = r[0], .sample_id = r[0], .count = r[1] - r[0] };
            const handle = try files.acquire(key, opener);
            const mapping = if (mapped >> @intCast(i) & 1 != 0) maps.get(testing.allocator, key, at, handle.fd).? else null;
            try fill.add(testing.allocator, run, .{ .handle = handle, .mapping = mapping });
        }
        @memset(&dest, '!');
        fill.start(&rt.pool, dest[0..@intCast(fill.bytes())], 0, 4, true);
        fill.settle(&rt.pool);
        // A kernel without RWF_NOWAIT for buffered reads refuses the reads: nothing placed
        // (but a mapped first run is copied: the file was just written).
        if (mapped & 1 != 0) try testing.expect(fill.placed > 0);
        if (fill.placed > 0) {
            try testing.expectEqualStrings(plan.placed, dest[0..fill.placed_bytes]);
            var total: usize = 0;
            for (fill.placed_lens[0..fill.placed]) |n| total += @intCast(n);
            try testing.expectEqual(fill.placed_bytes, total);
        }
        fill.release(&rt.pool, &files);
    };
}
