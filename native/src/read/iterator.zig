//! Iterators: a window of the dataset's stream, read ahead through a bounded prefetch
//! pipeline and delivered in plan order, in batches.
//!
//! Positions are planned (plan.zig: sampler → index row) into *slots*, one positioned read
//! each (one record or, in ordered mode, a run of adjacent records). Each slot's read goes
//! to the iterator's I/O backend (io/backend.zig), which completes reads in any order and
//! runs the slot's decode hook where the read finishes; the consumer waits for the oldest
//! slot and delivers slots in plan order (the reorder stage).
//!
//! Read buffers come from one byte ring per iterator (`ByteRing`), sized by the byte
//! budget (`Dataset.prefetchBytes`, `prefetch_bytes`): slots take their buffers from it in
//! plan order and give them back in plan order, so the same few MiB are reused read after
//! read (no new pages to fault in, and bytes read ahead are still in the CPU caches when
//! the consumer copies them out).
//!
//! Small records whose pages are in the page cache skip the backend: a run of them is one
//! slot, split straight out of read-only mappings of shard windows on the consumer thread
//! when it is planned (`planMapped`; the mappings, their residency snapshots and their
//! byte budget are `io/files.zig` `Maps`). The budget is `mapped_bytes_max` (48 MiB) for
//! ordered reads and every window, `random_mapped_bytes_max` (132 MiB), for shuffled
//! ones: random reads keep coming back to every window, and each record of a window left
//! out costs a system call. Such a slot holds no read buffer; its payloads point into the
//! mapping, which stays mapped until the slot is released. A record is served this way
//! only when a read would return the same bytes
//! (it lies inside its shard's manifest length, and the file is at least that long), so
//! both paths give the same samples, errors and order; a record the budget leaves
//! unmapped is read through the backend. Contiguous batches of an ordered window take
//! runs of such records with one read each into a small reused buffer instead
//! (`takeAdjacent`: no pages mapped and unmapped per epoch); the runs after the one being
//! copied are read ahead on the runtime's worker pool (read/adjacent.zig), as many as
//! the byte budget holds (2 to 16 runs of at most 128 KiB), so the workers read the next
//! batch while the caller works on this one.
//!
//! A caller that knows the memory of its next batches may stage them (`stageBatch`, two
//! at most): one pool job per batch places their payloads in that memory, back to back
//! (`adjacent_mod.Fill`: copied out of the dataset's mappings of their shards, or each
//! run read there and each payload moved down over its header and JSON), and the call
//! that reaches the batch only records where the payloads lie (`takeStaged`): no copy on
//! the caller's thread, whose copy out of the read-ahead was most of a W1 batch's time.
//!
//! A caller may also give buffers for the payloads read next (`givePayloadBuffers`;
//! Python's per-sample iteration gives the `bytes` objects it hands out): a large
//! uncompressed record whose payload is exactly as long as the first one is planned alone
//! (`planDest`), its header and JSON read from the page cache right then, its payload
//! read by the backend straight into the buffer, so it is copied once. Such a slot holds
//! no ring buffer; its record's bytes count in the byte budget all the same.
//!
//! Invariants (asserted in `checkInvariants`):
//! - At most `prefetch_size` samples are planned and not yet released by the consumer
//!   (in flight, completed, or in the batch last handed out), and the slots' buffers hold
//!   at most `budget` bytes, or one read when a single read is larger (their decoded
//!   bytes, `raw_bytes`, count too, known exactly only once decoded): an iterator's
//!   memory is bounded by `min(prefetch_size records, budget)` plus fixed buffers. A slow
//!   consumer stops reads. The read-ahead of `takeAdjacent` (contiguous ordered batches,
//!   which use no slots) is bounded by bytes alone: `max(budget, 256 KiB)` in runs whose
//!   records are not yet delivered.
//! - Slots form a ring in plan order: `used` slots from `head`, each holding consecutive
//!   window indexes; free slots are never queued. Their buffers are allocated from and
//!   returned to the byte ring in the same order.
//! - `delivered <= planned <= schedule.count`, and samples are delivered in window order.
//! - A batch whose payloads stay in the slot buffers (no copy) holds at most half the
//!   prefetch window and half the byte budget (at least one sample), so the other half
//!   stays in flight while the consumer works on the batch. A contiguous batch copies
//!   payloads into one arena (or the caller's memory, `nextBatchInto`) and releases
//!   slots as it goes, so it may be any size the caller asks for; while no slot is in
//!   use it takes records served from mappings straight into the batch (`takeMapped`:
//!   planned and delivered at once, so they never count against the window).
//! - The first batch of an iterator waits for one record only (its first read is planned
//!   alone), not for a whole window.
//! - Batch pointers stay valid until the next call on the iterator.
//! - Closing an iterator cancels or waits for every outstanding read before freeing the
//!   buffers the reads target. An error finishes the iterator; the dataset stays usable.

const std = @import("std");
const mem_mod = @import("../base/mem.zig");
const status = @import("../base/status.zig");
const shard = @import("../format/shard.zig");
const manifest = @import("../format/manifest.zig");
const index = @import("../format/index.zig");
const cache_mod = @import("../store/cache.zig");
const Cache = cache_mod.Cache;
const io = @import("../io/backend.zig");
const files_mod = @import("../io/files.zig");
const dataset_mod = @import("dataset.zig");
const plan = @import("plan.zig");
const batch_mod = @import("batch.zig");
const record = @import("record.zig");
const LookAhead = @import("lookahead.zig").LookAhead;
const adjacent_mod = @import("adjacent.zig");
const Dataset = dataset_mod.Dataset;
const Loc = dataset_mod.Loc;
const Table = dataset_mod.Table;

pub const Schedule = plan.Schedule;

/// A read shorter than this that the consumer would wait for at once runs on the
/// consumer's thread (see `fill`).
const inline_read_max = 64 << 10;

/// Records shorter than this whose pages are in the page cache are served from a
/// read-only mapping of their shard (see `Iter.mappedRecord`).
pub const mapped_record_max = 16 << 10;
/// A slot's decode buffer (`Slot.raw`) is freed on release when larger than this and
/// its share of the byte budget, counted as at most `slot_raw_keep_total`: with a budget
/// of many GiB every slot would otherwise keep the largest buffer it ever decoded into.
const slot_raw_keep_min = 256 << 10;
const slot_raw_keep_total = 64 << 20;

/// Records a step of a mapped run locates and prefetches together (see `planMapped`).
const mapped_step = 16;

/// A mapped record's bytes prefetched before it is decoded (its header, JSON and, for a
/// small record, the payload the consumer copies out next).
const prefetch_record_bytes = 1024;

/// Records at least this long, uncompressed, are read by the backend straight into a
/// contiguous batch's destination (`Iter.takeDirect`): one copy out of the page cache, on
/// the backend's threads. Smaller ones go through the slots (a header read each would
/// cost more than their second copy).
const direct_record_min = 64 << 10;

/// Records at most in one staged batch (`Iter.stageBatch`; a larger batch is staged in
/// part, the rest read the usual way).
const staged_records_max = 1 << 16;

/// Batches staged at once (`Iter.stageBatch`): the next call's, and the one after it,
/// read on two workers while the caller works on the batch it has.
const staged_batches_max = 2;

/// Batches whose records take fewer bytes are not staged (`Iter.stageBatch`): below it the
/// job, its wake-up and the caller's memory for it cost about what the copy they save
/// does. Jobs whose runs are all copied out of the dataset's shard mappings cost less
/// than reads, so such batches are staged from `staged_mapped_bytes_min`. W1 batches
/// staged against not, one process alternating (benchmarks/README.md rounds 19 and 20):
/// read, 1 and 16 samples 0.57x and 0.65x, 512 (300 KiB) and 1,024 (600 KiB) 0.95x and
/// 0.98x, 2,048 (1.2 MiB) 1.20x, 4,096 1.33x; mapped, 256 (150 KiB) 0.77x, 480 (264 KiB)
/// 1.05x, 512 1.45-1.6x, 1,024 1.26-1.29x.
const staged_bytes_min = 1 << 20;
const staged_mapped_bytes_min = 256 << 10;

/// Records at most in one run of `Iter.takeAdjacent` (its scratch arrays hold this many;
/// the run's bytes are bounded by `adjacent_read_max` too).
const adjacent_records_max = 256;

/// Bytes at most of one run of `Iter.takeAdjacent`: read into a scratch buffer of this
/// size, which stays in the CPU caches between the read and the copy into the batch.
const adjacent_read_max = 128 << 10;

/// Runs of `Iter.takeAdjacent` read ahead on the worker pool (`adjacent_mod.Ring`), each in a
/// buffer of `adjacent_read_max` bytes: as many as the byte budget holds, within these
/// bounds. Two are not enough: the consumer catches up and reads inline while the workers
/// sleep; 16 keep the workers reading the next batch while the caller works on the one
/// it has (measured: benchmarks/README.md, round 14). More are slower: the runs ahead
/// (8 MiB at 64) leave the caches before the consumer copies them (round 18).
const adjacent_ahead_min = 2;
const adjacent_ahead_max = 16;

/// A record read into a caller's payload buffer (`Iter.planDest`) has at most this many
/// bytes of header and JSON, read from the page cache when it is planned.
const dest_head_max = 64 << 10;

/// One read of `Iter.takeDirect`: a payload straight into the batch's destination.
const DirectRead = struct {
    read: io.Read = .{ .complete = onRead },
    it: *Iter = undefined,
    /// The shard's descriptor, pinned while the read may run.
    file: ?files_mod.Files.Handle = null,
    cache: u32 = 0,
    shard_id: u64 = 0,

    fn onRead(read: *io.Read) void {
        const d: *DirectRead = @fieldParentPtr("read", read);
        if (read.result == .ok) d.it.ds.countRead(d.it.io.ranBy(read), read.buf.len);
    }
};

/// Where one record's parts are after its slot is read and decoded.
const Decoded = struct {
    /// In `Slot.buf` or in a shard mapping: both stay put while the slot is in use.
    json: []const u8,
    /// The stored payload, where `json` is; unused for lz4 (`in_raw`).
    payload: []const u8,
    /// lz4: the payload is `raw_len` bytes at `raw_at` of `Slot.raw` (which may move
    /// while the slot decodes, so it is located when the sample is taken).
    raw_at: u64 = 0,
    raw_len: u64 = 0,
    in_raw: bool = false,
    /// A record read inline into `Slot.raw` (see `Iter.readRecord`): its JSON is
    /// `json_len` bytes at `json_at` there (`json` unused), its payload `in_raw`.
    json_at: u64 = 0,
    json_len: u64 = 0,
    json_in_raw: bool = false,
};

/// One positioned read of a planned span and its decoded records, or (`mapped`) a run of
/// records decoded straight from shard mappings, with no read.
const Slot = struct {
    read: io.Read = .{ .complete = onRead },
    it: *Iter = undefined,
    span: plan.Span = undefined,
    file: ?files_mod.Files.Handle = null,
    /// The span's bytes: a piece of the iterator's byte ring (empty for a 0-length span
    /// and for a mapped run).
    buf: []u8 = &.{},
    /// A run of records served from shard mappings: `span` holds only `first` and
    /// `count` (`len` 0: no buffer), and the records were decoded when it was planned.
    mapped: bool = false,
    /// One record whose payload is read straight into a caller's buffer (`Iter.planDest`):
    /// `decoded` (its JSON in `raw`, its payload the buffer) is set when it is planned,
    /// `buf` is empty, and `span.len` counts in `Iter.dest_bytes`.
    dest: bool = false,
    raw: std.ArrayList(u8) = .empty,
    /// Bytes of `raw` counted in `Iter.raw_bytes` while the slot is in use: estimated
    /// when planned for an lz4 read (`Iter.decodedEstimate`), exact for a mapped run.
    raw_charge: u64 = 0,
    decoded: std.ArrayList(Decoded) = .empty,
    failure: ?status.Error = null,
    /// The failure's message, whole (reused from failure to failure).
    message: std.ArrayList(u8) = .empty,

    fn deinit(s: *Slot, gpa: std.mem.Allocator) void {
        s.raw.deinit(gpa);
        s.decoded.deinit(gpa);
        s.message.deinit(gpa);
    }

    /// Remembers the failure (this may run on a worker; the consumer re-raises it in order).
    fn fail(s: *Slot, err: status.Error) void {
        const msg = status.lastMessage();
        s.message.clearRetainingCapacity();
        s.message.appendSlice(s.it.ds.gpa, msg) catch {
            // Out of memory: keep what fits, cut on a UTF-8 boundary.
            s.message.appendSliceAssumeCapacity(msg[0..status.utf8PrefixLen(msg, s.message.capacity)]);
        };
        s.failure = err;
    }

    /// The read's completion hook: runs on a pool worker (threads) or on the consumer
    /// while it reaps (io_uring).
    fn onRead(read: *io.Read) void {
        const s: *Slot = @fieldParentPtr("read", read);
        const ds = s.it.ds;
        switch (read.result) {
            .ok => {
                ds.countRead(s.it.io.ranBy(read), s.span.len);
                // A caller's buffer holds the payload; the record was split when planned.
                if (!s.dest) s.decode(ds) catch |err| s.fail(err);
                return;
            },
            .eof => s.fail(status.fail(error.Io, "I/O error: failed to fill whole buffer: {s}", .{s.path(ds)})),
            .os => |e| s.fail(status.failErrno(e, s.path(ds))),
            .pending => unreachable,
        }
        // Planned as decoded, but its payload was not read: nothing to deliver.
        if (s.dest) s.decoded.clearRetainingCapacity();
    }

    fn path(s: *const Slot, ds: *const Dataset) [:0]const u8 {
        return ds.caches[s.span.cache].shard_paths[@intCast(s.span.shard_id)];
    }

    /// Splits the records read and decompresses lz4 payloads into `raw`.
    fn decode(s: *Slot, ds: *Dataset) status.Error!void {
        const c = &ds.caches[s.span.cache];
        const compression = c.manifest.shards[@intCast(s.span.shard_id)].compression;
        s.decoded.clearRetainingCapacity();
        s.raw.clearRetainingCapacity();
        var at: u64 = 0;
        var k: u32 = 0;
        while (k < s.span.count) : (k += 1) {
            const loc = s.it.locAt(s.span.first + k);
            const row = c.row(loc.sample_id);
            try s.decodeRecord(ds.gpa, s.buf[@intCast(at)..@intCast(at + row.byte_len)], compression);
            at += row.byte_len;
        }
        std.debug.assert(at == s.span.len);
    }

    /// Splits one record `image` (which stays where it is while the slot is in use) and
    /// appends where its parts are; lz4 payloads are decompressed into `raw`.
    fn decodeRecord(s: *Slot, gpa: std.mem.Allocator, image: []const u8, compression: manifest.Compression) status.Error!void {
        const rec = try shard.split(image);
        var d: Decoded = .{ .json = rec.json, .payload = rec.stored_payload };
        if (compression == .lz4) {
            d.raw_at = s.raw.items.len;
            d.raw_len = try record.appendDecompressed(&s.raw, gpa, rec.stored_payload);
            d.in_raw = true;
            d.payload = &.{};
        }
        try s.decoded.append(gpa, d);
    }

    /// `decodeRecord` for an uncompressed record read into `raw` at `at` (`len` bytes):
    /// its parts are kept as places in `raw`, which may move while the slot decodes.
    fn decodeRaw(s: *Slot, gpa: std.mem.Allocator, at: u64, len: u64) status.Error!void {
        const image = s.raw.items[@intCast(at)..][0..@intCast(len)];
        const rec = try shard.split(image);
        try s.decoded.append(gpa, .{
            .json = &.{},
            .payload = &.{},
            .json_at = at + (@intFromPtr(rec.json.ptr) - @intFromPtr(image.ptr)),
            .json_len = rec.json.len,
            .json_in_raw = true,
            .raw_at = at + (@intFromPtr(rec.stored_payload.ptr) - @intFromPtr(image.ptr)),
            .raw_len = rec.stored_payload.len,
            .in_raw = true,
        });
    }
};

/// The read buffers of one iterator: a ring of bytes handed out in plan order and given
/// back in the same order (FIFO), so a fixed region is reused. `mem` holds the budget, or
/// more when a single read is larger (it grows only while nothing is handed out).
const ByteRing = struct {
    mem: []u8 = &.{},
    /// Oldest live allocation's start; end of the newest one.
    head: usize = 0,
    tail: usize = 0,
    /// Live allocations lie in `[head, wrap_end)` and `[0, tail)` when wrapped, else in
    /// `[head, tail)`.
    wrapped: bool = false,
    wrap_end: usize = 0,
    live: usize = 0,

    fn deinit(r: *ByteRing, gpa: std.mem.Allocator) void {
        mem_mod.freeUninit(gpa, r.mem);
        r.* = .{};
    }

    /// Bytes handed out and not given back (counting the unused end before a wrap).
    fn inUse(r: *const ByteRing) usize {
        if (r.live == 0) return 0;
        return if (r.wrapped) (r.wrap_end - r.head) + r.tail else r.tail - r.head;
    }

    /// Where `n` (> 0) bytes would go, or null when the ring has no room now. An empty
    /// ring always has room (it grows to `n` if needed, in `alloc`).
    /// Wraps to the front as soon as it has room, so the ring stays within about the
    /// bytes in flight (its pages past them are never touched), whatever its size.
    fn place(r: *const ByteRing, n: usize) ?usize {
        if (r.live == 0) return 0;
        if (r.wrapped) return if (r.head - r.tail >= n) r.tail else null;
        if (r.head >= n) return 0;
        if (r.mem.len - r.tail >= n) return r.tail;
        return null;
    }

    /// `n` (> 0) bytes, or null when they do not fit now. Never fails on an empty ring
    /// (except for memory): it grows to `max(n, capacity)` then (pages are touched only
    /// when read into, so an unused part of the budget costs no memory), or, when the
    /// system refuses that much address space (a budget of many GiB), to half as much,
    /// and so on down to `n`.
    fn alloc(r: *ByteRing, gpa: std.mem.Allocator, n: usize, capacity: usize) error{OutOfMemory}!?[]u8 {
        std.debug.assert(n > 0);
        if (r.live == 0) {
            r.head = 0;
            r.tail = 0;
            r.wrapped = false;
            if (n > r.mem.len) {
                var size = @max(n, capacity);
                const mem = while (true) {
                    break mem_mod.allocUninit(gpa, size) catch |err| {
                        if (size == n) return err;
                        size = @max(n, size / 2);
                        continue;
                    };
                };
                mem_mod.freeUninit(gpa, r.mem);
                r.mem = mem;
            }
        }
        const at = r.place(n) orelse return null;
        if (!r.wrapped and at == 0 and r.live > 0) {
            r.wrapped = true;
            r.wrap_end = r.tail;
        }
        r.tail = at + n;
        r.live += 1;
        return r.mem[at..][0..n];
    }

    /// Gives back the oldest live allocation, `buf`.
    fn free(r: *ByteRing, buf: []u8) void {
        std.debug.assert(r.live > 0 and buf.len > 0);
        const at = @intFromPtr(buf.ptr) - @intFromPtr(r.mem.ptr);
        std.debug.assert(at == r.head);
        r.live -= 1;
        if (r.live == 0) {
            r.* = .{ .mem = r.mem };
            return;
        }
        r.head = at + buf.len;
        if (r.wrapped and r.head == r.wrap_end) {
            r.wrapped = false;
            r.head = 0;
        }
    }
};

pub const Iter = struct {
    ds: *Dataset,
    table: *Table,
    /// The stream positions this iterator reads; `schedule.count` samples in all.
    schedule: Schedule,
    io: io.Io,
    /// Planned locations, indexed by window index modulo prefetch.
    loc_ring: []Loc,
    slots: []Slot,
    /// Slot ring: `head` is the oldest undelivered slot, `used` slots are in use.
    head: usize = 0,
    used: usize = 0,
    /// Samples of the head slot already delivered.
    head_taken: u32 = 0,
    /// Slots fully handed out by the last batch, released on the next call.
    pending_release: usize = 0,
    /// Window indexes: next to plan, next to deliver; samples the consumer still holds.
    planned: u64 = 0,
    delivered: u64 = 0,
    held_samples: u64 = 0,
    finished: bool = false,
    /// A failure met after some samples of a batch; raised by the next call.
    deferred: ?status.Error = null,
    deferred_message: [status.message_bytes_max]u8 = undefined,
    deferred_len: usize = 0,
    files: files_mod.Files = .{},
    /// Mapped shard windows for small resident records (see `mappedRecord`), within
    /// `files_mod.mapped_bytes_max` (ordered) or `random_mapped_bytes_max` (shuffled).
    maps: files_mod.Maps,
    /// Records shorter than this may be served from a mapping (0: every record is read
    /// through the backend; unit tests of the backends set it).
    map_max: u64 = mapped_record_max,
    /// Records served from mappings (or read inline, `inline_reads` of them) so far
    /// (tests check which path ran).
    mapped_records: u64 = 0,
    inline_reads: u64 = 0,
    /// Of `mapped_records`, those taken in runs by `takeAdjacent` (tests check it ran).
    adjacent_records: u64 = 0,
    /// Of those, the ones taken from a staged batch (`takeStaged`; tests check it ran).
    staged_records: u64 = 0,
    /// Batches whose records take fewer bytes are not staged, read or all mapped (tests
    /// lower them: the fixtures' batches are small).
    stage_min: struct { read: u64 = staged_bytes_min, mapped: u64 = staged_mapped_bytes_min } = .{},
    /// Records at least this long may be read straight into a batch's destination
    /// (`takeDirect`; tests lower it, the fixtures' records are small), and how many were.
    direct_min: u64 = direct_record_min,
    direct_reads: u64 = 0,
    batch: batch_mod.Buffers,
    /// Where a contiguous batch's payloads go when the caller gives no memory for them
    /// (`nextBatch`), as `nextBatchInto`'s go to the caller's: large records are then read
    /// straight into it by the backend (`takeDirect`, one copy) instead of into the ring
    /// and copied into the batch's arena, and no arena grows (and is filled) per iterator.
    /// Sized after a batch that did not fit: its payload bytes and an eighth more (the
    /// arena holds that batch; its memory is given back once batches fit). Taken from the
    /// dataset on open and given back on close (`Dataset.takeSpare`), so the next
    /// iterator's batches land in memory already faulted in.
    own_dest: []u8 = &.{},
    /// The slots' read buffers, and the bytes they may hold (see //!).
    ring: ByteRing = .{},
    /// Decoded bytes (lz4 payloads decompressed, records read inline) the slots in use
    /// hold or will hold in their `raw`: counted in the byte budget with the ring's.
    raw_bytes: u64 = 0,
    budget: u64,
    /// Coalesced reads stop growing at this size (0 in shuffled mode: one record each).
    coalesce: u64,
    /// Whether a batch was asked for (the first one waits for one record only).
    started: bool = false,
    /// Fetch-ahead of remote shards in plan order (a no-op for local caches).
    lookahead: LookAhead = .{},
    /// The reads of `takeDirect` (one per sample, at most `prefetch_size`).
    direct: []DirectRead,
    /// `takeAdjacent`'s scratch (allocated once, `adjacent_records_max` each): the run's
    /// record lengths, where its payloads start, then its payloads; and its read buffer
    /// (`adjacent_read_max`).
    adjacent_lens: []u64,
    adjacent_starts: []u32,
    adjacent_payloads: [][]const u8,
    adjacent_bytes: []u8,
    /// `takeAdjacent`'s runs read ahead on the pool. Allocated at its first use
    /// (`adjacent_ahead_min..max` runs within `budget`).
    ahead: adjacent_mod.Ring = .{},
    /// Contiguous batches read ahead into the caller's memory (`stageBatch`), in order
    /// from `staged_head`: the next call's, then the one after it.
    staged: [staged_batches_max]adjacent_mod.Fill = .{ .{}, .{} },
    /// The first of `staged` (the next call's batch); the other one follows it.
    staged_head: u1 = 0,
    /// Caller buffers for payloads read next (`givePayloadBuffers`): those not yet
    /// assigned to a record are `dests.items[dest_head..]`, in the order given.
    dests: std.ArrayList([]u8) = .empty,
    dest_head: usize = 0,
    /// Buffers assigned to records so far (over the iterator's life).
    dests_taken: u64 = 0,
    /// The last call that gave buffers (or reset) gave some: records that may take one
    /// wait for more when there are none left (`planDest`).
    dests_given: bool = false,
    /// Slots reading into caller buffers, not yet released, and their records' bytes
    /// (which count in the byte budget as the ring's buffers do).
    dest_slots: usize = 0,
    dest_bytes: u64 = 0,
    /// Kernel read-ahead hints for the records planned next (ordered reads, see
    /// `hintAhead`).
    hints: files_mod.Hints = .{},

    /// An iterator over the next window of the dataset's stream (reserved now).
    pub fn open(ds: *Dataset) status.Error!*Iter {
        return openSchedule(ds, null);
    }

    /// An iterator over explicit stream positions; the dataset's own position is untouched.
    pub fn openRange(ds: *Dataset, schedule: Schedule) status.Error!*Iter {
        try schedule.validate();
        return openSchedule(ds, schedule);
    }

    /// With no schedule, reserves the dataset's next window once nothing else can fail.
    fn openSchedule(ds: *Dataset, explicit: ?Schedule) status.Error!*Iter {
        try ds.runtime.checkPid();
        const gpa = ds.gpa;
        const prefetch: usize = @intCast(@min(ds.options.prefetch_size, 1 << 16));
        var batch = try batch_mod.Buffers.init(gpa, ds.fields.len);
        errdefer batch.deinit(gpa);
        const loc_ring = try gpa.alloc(Loc, prefetch);
        errdefer gpa.free(loc_ring);
        const slots = try gpa.alloc(Slot, prefetch);
        errdefer gpa.free(slots);
        @memset(slots, .{});
        const direct = try gpa.alloc(DirectRead, prefetch);
        errdefer gpa.free(direct);
        @memset(direct, .{});
        const adjacent_lens = try gpa.alloc(u64, adjacent_records_max);
        errdefer gpa.free(adjacent_lens);
        const adjacent_starts = try gpa.alloc(u32, adjacent_records_max);
        errdefer gpa.free(adjacent_starts);
        const adjacent_payloads = try gpa.alloc([]const u8, adjacent_records_max);
        errdefer gpa.free(adjacent_payloads);
        const adjacent_bytes = try mem_mod.allocUninit(gpa, adjacent_read_max);
        errdefer mem_mod.freeUninit(gpa, adjacent_bytes);
        const it = try gpa.create(Iter);
        errdefer gpa.destroy(it);
        var backend = io.Io.init(ds.io_kind, @intCast(prefetch), &ds.runtime.pool, ds.options.io_backend);
        errdefer backend.deinit();
        const table: *Table, const schedule: Schedule = if (explicit) |e| .{ ds.snapshotTable(), e } else blk: {
            const window = ds.reserveWindow();
            break :blk .{ window.table, .{ .start = window.start, .count = window.len } };
        };
        const budget = @max(ds.prefetchBytes(), 1);
        it.* = .{
            .ds = ds.retain(),
            .table = table,
            .schedule = schedule,
            .io = backend,
            .loc_ring = loc_ring,
            .slots = slots,
            .direct = direct,
            .adjacent_lens = adjacent_lens,
            .adjacent_starts = adjacent_starts,
            .adjacent_payloads = adjacent_payloads,
            .adjacent_bytes = adjacent_bytes,
            .batch = batch,
            .budget = budget,
            .maps = .{ .budget = if (ds.options.shuffle) files_mod.random_mapped_bytes_max else files_mod.mapped_bytes_max },
            // A quarter of the budget per read keeps several reads in flight (both cores
            // copy on the thread pool); never below one record, never above 4 MiB.
            .coalesce = if (ds.options.shuffle) 0 else std.math.clamp(budget / 4, 1, plan.coalesce_bytes_max),
        };
        it.own_dest = ds.takeSpare();
        for (slots) |*s| s.it = it;
        for (direct) |*d| d.it = it;
        it.hints.pool = &ds.runtime.pool;
        return it;
    }

    fn locAt(it: *const Iter, window_index: u64) Loc {
        return it.loc_ring[@intCast(window_index % it.loc_ring.len)];
    }

    fn slotAt(it: *Iter, i: usize) *Slot {
        std.debug.assert(i < it.used);
        return &it.slots[(it.head + i) % it.slots.len];
    }

    /// The bounds the header promises; a violation is our bug, never the caller's.
    fn checkInvariants(it: *const Iter) void {
        std.debug.assert(it.delivered <= it.planned and it.planned <= it.schedule.count);
        std.debug.assert(it.held_samples <= it.delivered);
        std.debug.assert(it.planned - it.delivered + it.held_samples <= it.loc_ring.len);
        std.debug.assert(it.used <= it.slots.len);
        std.debug.assert(it.pending_release <= it.used);
        std.debug.assert(it.head < it.slots.len);
        // The byte budget: exceeded only by a single read larger than it (decoded bytes,
        // known only once decoded, may exceed it by the record that crossed it).
        std.debug.assert(it.ring.inUse() + it.dest_bytes <= it.budget or it.ring.live + it.dest_slots <= 1);
        std.debug.assert(it.dest_slots <= it.used and it.dest_head <= it.dests.items.len);
        // The ring is in plan order: the head slot holds the next sample to deliver (or
        // was delivered whole), the last slot ends where planning stopped.
        if (it.used == 0) {
            std.debug.assert(it.planned == it.delivered and it.head_taken == 0);
        } else {
            const head = &it.slots[it.head];
            const last = &it.slots[(it.head + it.used - 1) % it.slots.len];
            std.debug.assert(head.span.first + it.head_taken <= it.delivered);
            std.debug.assert(last.span.first + last.span.count == it.planned);
        }
    }

    /// Plans and queues reads until the prefetch window or the byte budget is full, or
    /// the window ends. Before the first batch, plans the first record alone.
    fn fill(it: *Iter) status.Error!void {
        return it.fillReads(std.math.maxInt(usize));
    }

    /// `fill`, planning at most `reads_max` reads.
    fn fillReads(it: *Iter, reads_max: usize) status.Error!void {
        defer it.checkInvariants();
        const ds = it.ds;
        const prefetch = it.loc_ring.len;
        const window_limit = @min(it.schedule.count, it.delivered - it.held_samples + prefetch);
        const limit = if (it.started) window_limit else @min(window_limit, it.planned + 1);
        it.lookahead.advance(ds, it.table, it.schedule, it.planned);
        var reads: usize = 0;
        // Whether a record went to the backend through the slots (its bytes were not all
        // in the page cache, or it is large), and whether planning is among records
        // advised before: then the records after them may be advised too (`hintAhead`).
        var slot_reads = false;
        const hinted = it.planned < it.hints.cursor;
        while (it.planned < limit and it.used < it.slots.len and reads < reads_max) : (reads += 1) {
            const slot = &it.slots[(it.head + it.used) % it.slots.len];
            std.debug.assert(slot.read.state.load(.monotonic) != .queued and slot.file == null);
            const loc = ds.locate(it.table, it.schedule.position(it.planned));
            // Reads in flight are delivered before waiting for a shard's download, or
            // before opening descriptors past `files_mod.owned_max`.
            if (it.used > 0 and (!it.shardReady(loc) or it.filesFull(loc))) break;
            // Decoded bytes of mapped runs may fill the budget with no read buffer.
            if (it.raw_bytes > 0 and it.inUse() >= it.budget) break;
            if (it.planMapped(slot, loc, limit)) {
                it.planned += slot.span.count;
                it.used += 1;
                continue;
            }
            switch (it.planDest(slot, loc)) {
                .planned => {
                    it.planned += 1;
                    it.used += 1;
                    if (!it.started) io.runInline(&slot.read) else try it.io.queue(&slot.read);
                    continue;
                },
                .over_budget, .wait => break,
                .not_here => {},
            }
            const span = plan.nextFrom(ds, it.table, it.schedule, it.planned, loc, limit, it.coalesceFor(loc), it.loc_ring);
            const decoded = it.decodedEstimate(span.cache, span.shard_id, span.len);
            // The budget, counting what lz4 payloads decompress to: a read that does not
            // fit waits until older buffers come back (with nothing in flight any read
            // runs, so one larger than the budget does).
            if (span.len > 0 and (it.ring.live > 0 or it.dest_slots > 0 or it.raw_bytes > 0) and
                (it.inUse() +| span.len +| decoded > it.budget or it.ring.place(@intCast(span.len)) == null)) break;
            slot.raw_charge = decoded;
            it.raw_bytes += decoded;
            slot.span = span;
            slot.mapped = false;
            it.planned += slot.span.count;
            it.used += 1;
            slot.failure = null;
            slot.decoded.clearRetainingCapacity();
            slot.read.prepare(-1, &.{}, 0);
            // A slot that fails before I/O, or has nothing to read, completes right here;
            // its failure is raised in plan order like any other.
            const needs_read = it.prepareRead(slot) catch |err| blk: {
                slot.fail(err);
                break :blk false;
            };
            slot_reads = slot_reads or needs_read;
            if (!needs_read) {
                slot.read.skip();
            } else if (!it.started or (it.used == 1 and slot.span.len < inline_read_max)) {
                // The consumer waits for this read next (the first record, or a small
                // read when nothing else is in flight): it reads it itself, without a
                // hand-off to another thread and back.
                io.runInline(&slot.read);
            } else try it.io.queue(&slot.read);
        }
        try it.io.submit();
        if (slot_reads or hinted) it.hintAhead(slot_reads);
    }

    /// Whether the shard of the record at `loc` opens without waiting for a download
    /// under way (`Cache.shardReady`; its descriptor cached here, or a local cache).
    fn shardReady(it: *const Iter, loc: Loc) bool {
        const c = &it.ds.caches[loc.cache];
        if (c.source == null) return true;
        const shard_id = c.row(loc.sample_id).shard_id;
        if (shard_id >= c.manifest.shards.len) return true; // (the read reports it)
        return it.files.has(.{ .cache = loc.cache, .shard_id = shard_id }) or c.shardReady(shard_id);
    }

    /// Whether the shard of the record at `loc` would need a descriptor past the bound
    /// (`Files.full`).
    fn filesFull(it: *const Iter, loc: Loc) bool {
        const c = &it.ds.caches[loc.cache];
        return it.files.full(.{ .cache = loc.cache, .shard_id = c.row(loc.sample_id).shard_id });
    }

    /// The bytes counted in the byte budget now: read buffers, records read into
    /// callers' buffers, decoded bytes.
    fn inUse(it: *const Iter) u64 {
        return it.ring.inUse() +| it.dest_bytes +| it.raw_bytes;
    }

    /// What `len` stored bytes of shard `shard_id` decompress to, estimated from the
    /// shard's manifest lengths (0 for an uncompressed shard): an lz4 read's payloads
    /// are decompressed into its slot, and count in the byte budget.
    fn decodedEstimate(it: *const Iter, cache: u32, shard_id: u64, len: u64) u64 {
        const entry = &it.ds.caches[cache].manifest.shards[@intCast(shard_id)];
        if (entry.compression != .lz4 or entry.byte_len == 0) return 0;
        return std.math.lossyCast(u64, @as(u128, len) * entry.uncompressed_byte_len / entry.byte_len);
    }

    /// The coalescing bound for the read starting at `loc`: `coalesce` decompressed
    /// bytes, so an lz4 read stops at the stored bytes that decompress to it.
    fn coalesceFor(it: *const Iter, loc: Loc) u64 {
        if (it.coalesce == 0) return 0;
        const c = &it.ds.caches[loc.cache];
        const entry = &c.manifest.shards[@intCast(c.row(loc.sample_id).shard_id)];
        if (entry.compression != .lz4 or entry.uncompressed_byte_len <= entry.byte_len) return it.coalesce;
        return @max(1, std.math.lossyCast(u64, @as(u128, it.coalesce) * entry.byte_len / entry.uncompressed_byte_len));
    }

    /// Ordered reads: advises the kernel to read ahead the records planned next
    /// (`files_mod.Hints`), as many as fit in the byte budget past the ones planned, so
    /// the disk always has a budget's worth of requests beyond the reads in flight.
    /// Shuffled reads advise nothing (their next records are scattered, and a record is
    /// read alone as soon as it is planned), and neither do records of remote caches.
    /// Advice never changes what is read.
    /// `slot_reads`: this fill sent records to the backend through the slots; without
    /// any, planning only entered records advised before, and advice goes on only while
    /// the pool finds them outside the page cache (warm data stops it at once).
    fn hintAhead(it: *Iter, slot_reads: bool) void {
        if (it.coalesce == 0) return;
        const ds = it.ds;
        it.hints.reached(&it.files, it.planned);
        if (!slot_reads and it.hints.resident_seen) return;
        var k = @max(it.hints.cursor, it.planned);
        const opener = Dataset.ShardOpener{ .ds = ds };
        while (k < it.schedule.count) : (k += 1) {
            const loc = ds.locate(it.table, it.schedule.position(k));
            const c = &ds.caches[loc.cache];
            const row = c.row(loc.sample_id);
            // Remote caches: their shards reach the page cache as they download, and
            // opening one here would wait for its download.
            if (c.source != null or row.byte_len == 0 or row.shard_id >= c.manifest.shards.len) continue;
            if (!row.within(c.manifest.shards[@intCast(row.shard_id)].byte_len)) continue;
            if (!it.hints.room(it.budget, row.byte_len)) break;
            it.hints.add(&it.files, opener, .{ .cache = loc.cache, .shard_id = row.shard_id }, row.offset, row.byte_len, k + 1);
        }
        it.hints.flush(&it.files, opener);
        it.hints.cursor = k;
    }

    /// A record the mapping paths (`mappedRecord`, `readRecord`, `mappedAdjacent`) may
    /// take: not empty, under `map_max`, and in a shard read locally (not by byte ranges,
    /// see `prepareRead`).
    fn smallLocal(it: *const Iter, c: *const Cache, row: index.Row) bool {
        return row.byte_len > 0 and row.byte_len < it.map_max and !c.readsRanges(row.shard_id, .iterator);
    }

    /// The bytes of a small record whose pages were in the page cache when its shard was
    /// mapped, in the shard's mapping; null when it is read through the backend: a large
    /// record (the backend's reads copy it on the other cores and keep the resident set
    /// bounded by the byte budget), a record not in the page cache (many reads in flight
    /// beat one page fault at a time on the consumer), a record reaching past its shard's
    /// manifest length (the read reports it), or a shard that is not mapped.
    ///
    /// `window_index` is the record's plan index: its window stays mapped until the slots
    /// up to it are released (the mapping's pin), see `files_mod.Maps`.
    fn mappedRecord(it: *Iter, loc: Loc, window_index: u64) ?struct { []const u8, manifest.Compression } {
        const ds = it.ds;
        const c = &ds.caches[loc.cache];
        const row = c.row(loc.sample_id);
        if (!it.smallLocal(c, row)) return null;
        const entry = &c.manifest.shards[@intCast(row.shard_id)];
        const key: files_mod.Key = .{ .cache = loc.cache, .shard_id = row.shard_id };
        // Records from the head slot's first on may still be referenced (the slots not
        // yet released, and the one being planned).
        const pinned_from = if (it.used > 0) it.slots[it.head].span.first else it.planned;
        const bytes = it.maps.get(ds.gpa, key, entry.byte_len, row.offset, row.byte_len, &it.files, Dataset.ShardOpener{ .ds = ds }, .{
            .now = window_index,
            .pinned_from = pinned_from,
            .resident_only = true,
        }) orelse return null;
        return .{ bytes, entry.compression };
    }

    /// Reads a small uncompressed record that `mappedRecord` just did not serve because its
    /// window is outside the mapping budget (`Maps.over_budget`) into `slot.raw` right here with one `preadv2`, only
    /// if its bytes are all in the page cache (`files_mod.readResident`): one system
    /// call, cheaper than a backend read of one record, and never a wait for the disk.
    /// Shuffled reads only (one record per backend read there).
    /// Returns where it is in `slot.raw`, or null: read it through the backend (also
    /// for any failure, which the backend read then reports).
    fn readRecord(it: *Iter, slot: *Slot, loc: Loc) ?u64 {
        // Ordered reads coalesce adjacent records into one backend read instead; a
        // record whose window is mapped but was not resident then goes to the backend too
        // (cold data: many reads in flight).
        if (it.coalesce != 0 or !it.maps.over_budget) return null;
        const ds = it.ds;
        const c = &ds.caches[loc.cache];
        const row = c.row(loc.sample_id);
        if (!it.smallLocal(c, row)) return null;
        const entry = &c.manifest.shards[@intCast(row.shard_id)];
        if (entry.compression != .none) return null;
        if (!row.within(entry.byte_len)) return null;
        const handle = it.files.acquire(.{ .cache = loc.cache, .shard_id = row.shard_id }, Dataset.ShardOpener{ .ds = ds }) catch return null;
        defer it.files.release(handle);
        const at = slot.raw.items.len;
        slot.raw.ensureUnusedCapacity(ds.gpa, @intCast(row.byte_len)) catch return null;
        const buf = slot.raw.unusedCapacitySlice()[0..@intCast(row.byte_len)];
        if (!files_mod.readResident(handle.fd, buf, row.offset)) return null;
        slot.raw.items.len += buf.len;
        it.inline_reads += 1;
        return at;
    }

    /// Plans into `slot` the run of records from window index `planned` (located at
    /// `first`) served from shard mappings: consecutive records, each `mappedRecord` (or,
    /// outside the mapping budget, `readRecord`), in any cache and shard, up to `limit`,
    /// decoded here on the consumer thread (no backend read, no ring buffer). A record
    /// that fails to decode ends the run and is raised in plan order. Returns false,
    /// planning nothing, when the first record is neither.
    ///
    /// Shuffled records are scattered over the index and the shards, so each costs cache
    /// and TLB misses: the run goes in steps of up to `mapped_step` records, each step
    /// locating its records and prefetching their index rows, then prefetching their
    /// bytes, then decoding them, so the misses of a step overlap. Steps start at one
    /// record and double while records keep being mapped, so a record read through the
    /// backend is located once, not a step's worth of times.
    fn planMapped(it: *Iter, slot: *Slot, first: Loc, limit: u64) bool {
        const ds = it.ds;
        var locs: [mapped_step]Loc = undefined;
        var images: [mapped_step][]const u8 = undefined;
        var compressions: [mapped_step]manifest.Compression = undefined;
        // Records read inline into `slot.raw` (see `readRecord`): where (images[j] empty).
        var raw_at: [mapped_step]u64 = undefined;
        var count: u32 = 0;
        var bytes: u64 = 0;
        var step: u64 = 1;
        slot.decoded.clearRetainingCapacity();
        slot.raw.clearRetainingCapacity();
        slot.failure = null;
        run: while (true) {
            const base = it.planned + count;
            const n: usize = @intCast(@min(step, limit - base));
            locs[0] = if (count == 0) first else ds.locate(it.table, it.schedule.position(base));
            for (1..n) |j| {
                locs[j] = ds.locate(it.table, it.schedule.position(base + j));
                const c = &ds.caches[locs[j].cache];
                @prefetch(c.index_map.ptr + locs[j].sample_id * index.row_bytes, .{});
            }
            var mapped: usize = 0;
            while (mapped < n) : (mapped += 1) {
                // The run's records are delivered before waiting for a shard's download.
                if (count + mapped > 0 and !it.shardReady(locs[mapped])) break;
                if (it.mappedRecord(locs[mapped], base + mapped)) |found| {
                    images[mapped], compressions[mapped] = found;
                } else {
                    raw_at[mapped] = it.readRecord(slot, locs[mapped]) orelse break;
                    images[mapped] = &.{};
                    compressions[mapped] = .none;
                    continue;
                }
                const image = images[mapped];
                batch_mod.prefetchBytes(image.ptr, @min(image.len, prefetch_record_bytes));
            }
            for (0..mapped) |j| {
                it.loc_ring[@intCast((base + j) % it.loc_ring.len)] = locs[j];
                count += 1;
                const inline_len = if (images[j].len == 0) ds.caches[locs[j].cache].row(locs[j].sample_id).byte_len else 0;
                bytes += images[j].len + inline_len;
                const decoded = if (images[j].len > 0)
                    slot.decodeRecord(ds.gpa, images[j], compressions[j])
                else
                    slot.decodeRaw(ds.gpa, raw_at[j], inline_len);
                decoded catch |err| {
                    slot.fail(err);
                    break :run;
                };
                // Decompressed payloads and records read inline are in `raw`: the run
                // ends once they fill the byte budget, or reach what one coalesced read
                // holds (so a slot's buffer never grows to the whole window).
                if (slot.raw.items.len > 0 and (it.inUse() +| slot.raw.items.len > it.budget or slot.raw.items.len >= plan.coalesce_bytes_max)) break :run;
            }
            if (mapped < n or base + n >= limit) break;
            step = @min(step * 2, mapped_step);
        }
        if (count == 0) return false;
        _ = ds.bytes_read.fetchAdd(bytes, .monotonic);
        slot.raw_charge = slot.raw.items.len;
        it.raw_bytes += slot.raw_charge;
        it.mapped_records += count;
        slot.mapped = true;
        slot.span = .{ .first = it.planned, .count = count, .cache = first.cache, .shard_id = 0, .offset = 0, .len = 0 };
        slot.buf = &.{};
        slot.read.prepare(-1, &.{}, 0);
        slot.read.skip();
        return true;
    }

    /// Caller memory for the payloads of the samples read next (see
    /// drt_iter_give_payload_buffers): appends `bufs` to the queue of buffers not yet
    /// assigned, after emptying it with `reset`. Each buffer must stay valid and untouched
    /// until the sample whose payload it holds is delivered (the batch's payload pointer
    /// is the buffer), the queue is reset before it was assigned, or the iterator is
    /// closed. Returns the buffers assigned so far (`planDest` takes them in order).
    pub fn givePayloadBuffers(it: *Iter, bufs: []const []u8, reset: bool) error{OutOfMemory}!u64 {
        const gpa = it.ds.gpa;
        if (reset) it.dests.clearRetainingCapacity() else {
            // Drop the assigned ones (the slots hold them now).
            const left = it.dests.items.len - it.dest_head;
            std.mem.copyForwards([]u8, it.dests.items[0..left], it.dests.items[it.dest_head..]);
            it.dests.items.len = left;
        }
        it.dest_head = 0;
        try it.dests.appendSlice(gpa, bufs);
        if (reset or bufs.len > 0) it.dests_given = bufs.len > 0;
        return it.dests_taken;
    }

    /// `wait`: the caller gives buffers (the last call gave some) and has none left now,
    /// and this record would likely take one: it is planned once more buffers come (reads
    /// into the read buffers instead would cost the consumer a copy each).
    const DestPlan = enum { planned, not_here, over_budget, wait };

    /// Plans into `slot` the record at `loc` (window index `planned`) alone, its payload
    /// read by the backend straight into the first caller buffer (`givePayloadBuffers`),
    /// when that buffer is exactly as long as the payload: one copy out of the page cache,
    /// on the backend's threads, into memory the caller hands out as it is (no copy on
    /// the consumer). Only an uncompressed, local record of at least `direct_min` bytes
    /// within its shard, whose header and JSON (the record's bytes before the payload)
    /// are in the page cache: they are read here, checked (the header's JSON length must
    /// put the payload exactly where the buffer says) and split, so the read fills only
    /// the buffer. Anything else is `not_here` (read as usual, which reports any fault:
    /// the same samples and errors either way); `over_budget` when the record does not fit
    /// in the byte budget now.
    fn planDest(it: *Iter, slot: *Slot, loc: Loc) DestPlan {
        if (!it.dests_given) return .not_here;
        const ds = it.ds;
        const c = &ds.caches[loc.cache];
        const row = c.row(loc.sample_id);
        if (row.byte_len < @max(it.direct_min, 1) or c.readsRanges(row.shard_id, .iterator)) return .not_here;
        const entry = &c.manifest.shards[@intCast(row.shard_id)];
        if (entry.compression != .none or !row.within(entry.byte_len)) return .not_here;
        // Nothing in use: never wait (the consumer waits for this record next).
        if (it.dest_head == it.dests.items.len) return if (it.used > 0) .wait else .not_here;
        const dest = it.dests.items[it.dest_head];
        if (dest.len == 0 or dest.len > row.byte_len - @min(row.byte_len, shard.header_bytes)) return .not_here;
        const head_len: usize = @intCast(row.byte_len - dest.len);
        if (head_len > dest_head_max) return .not_here;
        if ((it.ring.live > 0 or it.dest_slots > 0 or it.raw_bytes > 0) and it.inUse() +| row.byte_len > it.budget) return .over_budget;
        const handle = it.files.acquire(.{ .cache = loc.cache, .shard_id = row.shard_id }, Dataset.ShardOpener{ .ds = ds }) catch return .not_here;
        slot.raw.clearRetainingCapacity();
        slot.decoded.clearRetainingCapacity();
        const planned = blk: {
            slot.raw.ensureTotalCapacity(ds.gpa, head_len) catch break :blk false;
            slot.decoded.ensureTotalCapacity(ds.gpa, 1) catch break :blk false;
            const head = slot.raw.allocatedSlice()[0..head_len];
            // Only from the page cache: a wait for the disk here would serialize cold
            // reads on the consumer (the slots keep many in flight).
            break :blk files_mod.readResident(handle.fd, head, row.offset) and
                std.mem.readInt(u64, head[0..shard.header_bytes], .little) == head_len - shard.header_bytes;
        };
        if (!planned) {
            it.files.release(handle);
            return .not_here;
        }
        slot.raw.items.len = head_len;
        slot.decoded.appendAssumeCapacity(.{
            .json = &.{},
            .payload = dest,
            .json_at = shard.header_bytes,
            .json_len = head_len - shard.header_bytes,
            .json_in_raw = true,
        });
        it.loc_ring[@intCast(it.planned % it.loc_ring.len)] = loc;
        slot.span = .{ .first = it.planned, .count = 1, .cache = loc.cache, .shard_id = row.shard_id, .offset = row.offset, .len = row.byte_len };
        slot.mapped = false;
        slot.dest = true;
        slot.failure = null;
        slot.file = handle;
        slot.buf = &.{};
        slot.read.prepare(handle.fd, dest, row.offset + head_len);
        it.dest_head += 1;
        it.dests_taken += 1;
        it.dest_slots += 1;
        it.dest_bytes += row.byte_len;
        return .planned;
    }

    /// Checks a planned slot's range, pins its shard descriptor and sizes its buffer.
    /// Returns false when there is nothing to read (a 0-length record from a corrupt
    /// index: decoded right away, which reports it, instead of an empty read).
    fn prepareRead(it: *Iter, slot: *Slot) status.Error!bool {
        const ds = it.ds;
        const span = slot.span;
        const shard_len = ds.caches[span.cache].manifest.shards[@intCast(span.shard_id)].byte_len;
        if (span.offset > shard_len or span.len > shard_len - span.offset) {
            return status.fail(error.Io, "I/O error: failed to fill whole buffer: {s}", .{slot.path(ds)});
        }
        const c = &ds.caches[span.cache];
        if (span.len > 0 and c.readsRanges(span.shard_id, .iterator)) {
            // A remote shard read by byte ranges (io/remote.zig's policy): the span's
            // bytes come from object storage right here, with no shard file.
            slot.buf = (try it.ring.alloc(ds.gpa, @intCast(span.len), @intCast(it.budget))) orelse unreachable;
            try c.readRange(span.shard_id, span.offset, slot.buf);
            ds.countRead(it.io.kind(), span.len);
            try slot.decode(ds);
            return false;
        }
        const handle = try it.files.acquire(.{ .cache = span.cache, .shard_id = span.shard_id }, Dataset.ShardOpener{ .ds = ds });
        slot.file = handle;
        if (span.len == 0) {
            slot.buf = &.{};
            try slot.decode(ds);
            return false;
        }
        // fill checked that the span fits.
        slot.buf = (try it.ring.alloc(ds.gpa, @intCast(span.len), @intCast(it.budget))) orelse unreachable;
        slot.read.prepare(handle.fd, slot.buf, span.offset);
        return true;
    }

    fn releaseFile(it: *Iter, slot: *Slot) void {
        if (slot.file) |handle| it.files.release(handle);
        slot.file = null;
    }

    /// Gives a delivered slot's buffer back to the byte ring (oldest first).
    fn releaseBuffer(it: *Iter, slot: *Slot) void {
        if (slot.buf.len > 0) it.ring.free(slot.buf);
        slot.buf = &.{};
    }

    fn addSample(it: *Iter, slot: *Slot, k: u32) status.Error!void {
        const d = slot.decoded.items[k];
        const payload = if (d.in_raw) slot.raw.items[@intCast(d.raw_at)..][0..@intCast(d.raw_len)] else d.payload;
        const json = if (d.json_in_raw) slot.raw.items[@intCast(d.json_at)..][0..@intCast(d.json_len)] else d.json;
        try it.batch.add(it.ds, it.locAt(slot.span.first + k), json, payload);
    }

    fn deferFailure(it: *Iter, err: status.Error) void {
        const msg = status.lastMessage();
        const n = @min(msg.len, it.deferred_message.len);
        @memcpy(it.deferred_message[0..n], msg[0..n]);
        it.deferred_len = n;
        it.deferred = err;
    }

    /// Releases the slots fully handed out by the previous batch.
    fn releaseDelivered(it: *Iter) void {
        while (it.pending_release > 0) : (it.pending_release -= 1) {
            const slot = &it.slots[it.head];
            std.debug.assert(slot.read.isDone());
            it.releaseFile(slot);
            it.releaseBuffer(slot);
            it.raw_bytes -= slot.raw_charge;
            slot.raw_charge = 0;
            // A slot keeps its share of the budget (of at most `slot_raw_keep_total`) for
            // the next read it decodes, not the most one ever decompressed.
            if (slot.raw.capacity > @max(slot_raw_keep_min, @min(it.budget, slot_raw_keep_total) / it.slots.len)) slot.raw.clearAndFree(it.ds.gpa);
            if (slot.dest) {
                it.dest_slots -= 1;
                it.dest_bytes -= slot.span.len;
                slot.dest = false;
            }
            it.head = (it.head + 1) % it.slots.len;
            it.used -= 1;
        }
        it.held_samples = 0;
    }

    /// Fills `out` with the next samples (count 0 at the end). See drt_iter_next_batch.
    pub fn nextBatch(it: *Iter, max_count: u64, contiguous: bool) status.Error!batch_mod.View {
        return it.nextBatchTo(max_count, contiguous, if (contiguous) it.own_dest else &.{}, contiguous);
    }

    /// A contiguous batch whose payloads go to `dest` while they all fit (the view's
    /// `payload_base` is then `dest.ptr`; else the iterator's arena). See
    /// drt_iter_next_batch_into.
    pub fn nextBatchInto(it: *Iter, max_count: u64, dest: []u8) status.Error!batch_mod.View {
        return it.nextBatchTo(max_count, true, dest, false);
    }

    /// `own`: `dest` is `own_dest`, sized here for the next batch. A record's error names
    /// its shard file (the record is the next one to deliver, see `deliver`).
    fn nextBatchTo(it: *Iter, max_count: u64, contiguous: bool, dest: []u8, own: bool) status.Error!batch_mod.View {
        return it.nextBatchOf(max_count, contiguous, dest, own) catch |err| {
            if (it.delivered >= it.schedule.count) return err;
            return it.ds.recordError(it.ds.locate(it.table, it.schedule.position(it.delivered)), err);
        };
    }

    fn nextBatchOf(it: *Iter, max_count: u64, contiguous: bool, dest: []u8, own: bool) status.Error!batch_mod.View {
        const ds = it.ds;
        try ds.runtime.checkPid();
        // The first staged batch is this call's (taken below) or dropped.
        var took_staged = false;
        defer it.advanceStaged(took_staged);
        if (max_count == 0) return status.fail(error.InvalidArgument, "max_count must be at least 1", .{});
        it.releaseDelivered();
        if (it.deferred) |err| {
            it.deferred = null;
            it.finished = true;
            return status.failText(err, it.deferred_message[0..it.deferred_len]);
        }
        if (it.finished or it.delivered >= it.schedule.count) {
            it.finished = true;
            return .{};
        }
        errdefer it.finished = true;
        try it.batch.reset(ds.gpa, ds.fields);
        if (!contiguous) {
            // Payloads stay in the slots: hand out at most half the window so the other
            // half keeps reading while the caller copies this batch.
            try it.fill();
            const half_window = @max(1, it.loc_ring.len / 2);
            const first_batch = !it.started;
            it.started = true;
            const taken = try it.deliver(@min(max_count, half_window), it.budget / 2);
            std.debug.assert(taken >= 1 and taken <= half_window);
            it.held_samples = taken;
            // The first record came alone; the next read runs while the caller works on
            // it (the rest of the window is planned on the next call, so the first sample
            // never waits for a window's worth of submissions).
            if (first_batch) try it.fillReads(1);
        } else {
            // Payloads are copied into `dest` (or the batch arena), so slots are released
            // round by round and a batch may be larger than the prefetch window. While
            // nothing is planned ahead, records served from mappings go straight into the
            // batch, as many as it takes (no slot, no window round).
            it.batch.into(dest);
            took_staged = try it.takeStaged(max_count, dest);
            // DRT_BATCH_BOUNDED: the payloads stop at about the byte budget.
            const bytes_max: ?u64 = if (it.batch.bounded) it.budget else null;
            while (it.batch.count() < max_count and it.delivered < it.schedule.count and it.deferred == null) {
                const room: ?u64 = if (bytes_max) |m| m -| it.batch.payloadBytes() else null;
                if (room == 0) break;
                if (it.used == 0 and try it.takeMapped(max_count - it.batch.count(), room) > 0) {
                    it.started = true;
                    continue;
                }
                if (it.used == 0 and (try it.takeDirect(max_count - it.batch.count()) > 0 or it.deferred != null)) {
                    it.started = true;
                    continue;
                }
                try it.fill();
                it.started = true;
                const first = it.batch.count();
                if (try it.deliver(max_count - first, room) == 0) break;
                try it.batch.pack(ds.gpa, first);
                it.releaseDelivered();
            }
        }
        if (own) it.fitOwnDest();
        it.checkInvariants();
        return it.batch.view(ds.fields, contiguous);
    }

    /// Stages a contiguous batch (see drt_iter_stage_batch): the batch after those staged
    /// already (at most `staged_batches_max`; the first one from the next position) when
    /// its `max_count` samples (or those up to the end of the window) are runs of
    /// adjacent records that `takeAdjacent` would take, their records' bytes reach the
    /// staging minimum (`stage_min`) and fit in `dest`: one pool job starts placing their
    /// payloads in `dest` (`adjacent_mod.Fill`), and the `nextBatchInto(max_count, dest)`
    /// that reaches them takes them without copying. Returns the bytes `dest` needs for that (0: it cannot be staged); nothing
    /// is staged when `dest` is shorter. A next call that is not the first staged
    /// batch's drops every staged batch (waiting for their jobs), and so does `close`:
    /// `dest` is not written after either returns.
    pub fn stageBatch(it: *Iter, max_count: u64, dest: []u8) status.Error!u64 {
        const ds = it.ds;
        try ds.runtime.checkPid();
        const pool = &ds.runtime.pool;
        if (max_count == 0) return status.fail(error.InvalidArgument, "max_count must be at least 1", .{});
        if (it.finished or it.deferred != null or !it.started or it.used != 0 or it.planned != it.delivered) return 0;
        if (ds.options.shuffle or it.table.cache.len != 0 or ds.options.validate_cache) return 0;
        // One worker would read the staged batches one after the other into memory not
        // in its caches, slower than the read-ahead and the caller's copy side by side.
        if (ds.runtime.num_workers < staged_batches_max) return 0;
        // From the end of the batch staged last, which must be a whole batch of this size.
        var start = it.delivered;
        const slot = for ([_]u1{ it.staged_head, it.staged_head ^ 1 }) |i| {
            const f = &it.staged[i];
            if (!f.active) break f;
            if (!f.whole or f.max_count != max_count) return 0;
            start = f.first +| max_count;
        } else return 0;
        const end = @min(it.schedule.count, start +| max_count);
        if (start >= end) return 0;
        // Plan: runs from index rows alone, each descriptor pinned (released below when
        // nothing is staged).
        const f = slot;
        try f.begin(ds.gpa, @intCast(@min(end - start, staged_records_max) + adjacent_records_max));
        var k = start;
        var all_mapped = true;
        while (k < end and f.lens.items.len < staged_records_max) {
            const run = it.planRun(k, end, f.lensRoom()) orelse break;
            const handle = (it.files.acquireWithin(run.key, Dataset.ShardOpener{ .ds = ds }) catch break) orelse break;
            const mapping = ds.shardMapping(run.key, handle.fd);
            all_mapped = all_mapped and mapping != null;
            f.add(ds.gpa, run, .{ .handle = handle, .mapping = mapping }) catch |err| {
                it.files.release(handle);
                f.unpin(&it.files);
                return err;
            };
            k = run.end();
        }
        const needed = f.bytes();
        if (f.runs.items.len == 0 or needed < if (all_mapped) it.stage_min.mapped else it.stage_min.read) {
            f.unpin(&it.files);
            return 0;
        }
        if (needed > dest.len) {
            f.unpin(&it.files);
            return needed;
        }
        // The read-ahead's runs are for these positions: the jobs read them instead.
        if (start == it.delivered) it.ahead.clear(pool, &it.files);
        f.start(pool, dest, start, max_count, k == end and end - start == max_count);
        return needed;
    }

    /// At the start of a contiguous batch into `dest`: the records the first staged
    /// batch placed in `dest` (when it was staged for this call: same memory, same
    /// position, same size), added where they lie (`Buffers.addRun` without a copy).
    /// Stops at the first that `addRun` leaves (the usual paths then read it and what
    /// follows, overwriting the rest of `dest`). Returns whether the staged batch was
    /// this call's.
    fn takeStaged(it: *Iter, max_count: u64, dest: []u8) status.Error!bool {
        const f = &it.staged[it.staged_head];
        if (!f.active) return false;
        const ds = it.ds;
        f.settle(&ds.runtime.pool);
        if (dest.ptr != f.dest.ptr or dest.len != f.dest.len or it.delivered != f.first or max_count != f.max_count) return false;
        if (!it.batch.stored_metadata or it.batch.bounded or it.used != 0 or it.planned != it.delivered) return false;
        std.debug.assert(it.batch.count() == 0 and it.batch.payloadBytes() == 0);
        const payloads = it.adjacent_payloads;
        var left: usize = @intCast(@min(f.placed, max_count));
        var run_first: usize = 0;
        var at: usize = 0;
        for (f.runs.items) |run| {
            var j: usize = 0;
            while (j < run.count and left > 0) {
                const n = @min(run.count - j, left, payloads.len);
                for (payloads[0..n], f.placed_lens[run_first + j ..][0..n]) |*p, len| {
                    p.* = dest[at..][0..@intCast(len)];
                    at += @intCast(len);
                }
                const added = it.batch.addRun(ds, run.key.cache, run.sample_id + j, payloads[0..n], true) catch |err| switch (err) {
                    error.OutOfMemory => return error.OutOfMemory,
                    else => return true,
                };
                if (added == 0) return true;
                // Claimed where they lie: nothing copied. What `addRun` did not take is
                // read again by the usual paths.
                for (payloads[added..n]) |p| at -= p.len;
                it.delivered += added;
                it.planned += added;
                it.adjacent_records += added;
                it.staged_records += added;
                it.started = true;
                left -= added;
                j += added;
            }
            if (j < run.count) return true;
            run_first += run.count;
        }
        return true;
    }

    /// After a call: the first staged batch is done with (taken or not); the next one
    /// becomes the first when the call took its predecessor and ended where it starts,
    /// else every staged batch is dropped.
    fn advanceStaged(it: *Iter, took: bool) void {
        const pool = &it.ds.runtime.pool;
        it.staged[it.staged_head].release(pool, &it.files);
        const next = &it.staged[it.staged_head ^ 1];
        // (Jobs may be running: the slots are rotated, never moved.)
        if (next.active and took and it.deferred == null and !it.finished and it.delivered == next.first) {
            it.staged_head ^= 1;
            return;
        }
        next.release(pool, &it.files);
    }

    /// After a contiguous batch into `own_dest`: when it did not fit (its payloads are in
    /// the arena), `own_dest` grows to hold one like it; when it did, the arena's memory
    /// is given back. Memory only: a failed allocation leaves batches to the arena.
    fn fitOwnDest(it: *Iter) void {
        const gpa = it.ds.gpa;
        if (it.batch.in_dest) return it.batch.freeArena(gpa);
        const bytes = it.batch.payloadBytes();
        if (bytes <= it.own_dest.len) return;
        const mem = mem_mod.allocUninit(gpa, bytes + bytes / 8) catch return;
        mem_mod.freeUninit(gpa, it.own_dest);
        it.own_dest = mem;
    }

    /// Contiguous batches, with nothing planned ahead: appends up to `wanted` next
    /// samples whose records `mappedRecord` serves (uncompressed), copying each payload
    /// from the mapping straight into the batch's contiguous payloads. Stops at the first
    /// record that is not served so (the slots read it), or after the step in which the
    /// records' bytes reach `bytes_max`. A failure after samples of this batch is
    /// deferred like `deliver`'s. Returns the samples taken.
    fn takeMapped(it: *Iter, wanted: u64, bytes_max: ?u64) status.Error!u64 {
        std.debug.assert(it.used == 0 and it.planned == it.delivered and it.head_taken == 0);
        const ds = it.ds;
        const end = @min(it.schedule.count, it.delivered +| wanted);
        if (it.map_max == 0 or it.delivered >= end) return 0;
        it.lookahead.advance(ds, it.table, it.schedule, it.planned);
        try it.batch.reserve(ds.gpa, ds.fields, @intCast(@min(end - it.delivered, 1 << 16)));
        var locs: [mapped_step]Loc = undefined;
        var images: [mapped_step][]const u8 = undefined;
        var taken: u64 = 0;
        var bytes: u64 = 0;
        // In steps (as `planMapped`): locate a step's records, prefetch their index rows,
        // then their bytes, then copy them out, so the misses of a step overlap.
        run: while (it.delivered < end) {
            if (bytes_max) |m| if (bytes >= m) break;
            if (bytes_max == null) {
                // Unbounded batches only: a bounded batch ends after the step in which
                // its bytes reach the bound, so its steps stay `mapped_step` records.
                const adjacent, const adjacent_bytes = try it.takeAdjacent(end);
                if (adjacent > 0) {
                    taken += adjacent;
                    bytes += adjacent_bytes;
                    continue;
                }
            }
            const n: usize = @intCast(@min(mapped_step, end - it.delivered));
            it.locateStep(it.delivered, locs[0..n]);
            for (locs[0..n]) |loc| {
                const c = &ds.caches[loc.cache];
                @prefetch(c.index_map.ptr + loc.sample_id * index.row_bytes, .{});
            }
            var mapped: usize = it.mappedAdjacent(locs[0..n], images[0..n]);
            while (mapped < n) : (mapped += 1) {
                // Plan index as the stamp; `pinned_from` is `planned` (== `delivered`), so
                // this step's windows stay mapped until its copies are done.
                const image, const compression = it.mappedRecord(locs[mapped], it.delivered + mapped) orelse break;
                if (compression != .none) break;
                images[mapped] = image;
                batch_mod.prefetchBytes(image.ptr, @min(image.len, prefetch_record_bytes));
            }
            var j: usize = 0;
            while (j < mapped) {
                // Runs of one cache's consecutive samples in bulk (`addRun`); a record
                // it leaves (a null in its metadata.arrow row, a record that does not
                // split, parsed metadata) one at a time, which raises its error.
                const run = try it.copyRun(locs[j..mapped], images[j..mapped]);
                if (run > 0) {
                    for (images[j..][0..run]) |image| bytes += image.len;
                    it.delivered += run;
                    it.planned += run;
                    taken += run;
                    j += run;
                    continue;
                }
                const added = if (shard.split(images[j])) |rec|
                    it.batch.addCopy(ds, locs[j], rec.json, rec.stored_payload)
                else |err|
                    err;
                added catch |err| {
                    if (err == error.OutOfMemory or it.batch.count() == 0) return err;
                    it.deferFailure(err);
                    break :run;
                };
                it.delivered += 1;
                it.planned += 1;
                taken += 1;
                bytes += images[j].len;
                j += 1;
            }
            if (mapped < n) break;
        }
        _ = ds.bytes_read.fetchAdd(bytes, .monotonic);
        it.mapped_records += taken;
        return taken;
    }

    /// `takeMapped`'s path for an ordered window over the physical samples (no shuffle, no
    /// table of identities) with stored metadata (no `validate_cache`): the next samples,
    /// up to plan index `end`, while they are consecutive samples of one cache whose
    /// records lie back to back in one uncompressed local shard (each one `mappedRecord`
    /// would serve), from one read of their whole range (at most `adjacent_read_max`
    /// bytes and `adjacent_records_max` records) into `adjacent_bytes`, made only when
    /// every byte is in the page cache (`readAdjacent`), split here and added with one
    /// `Buffers.addRun`. Per run, not per record: one system call, one kind dispatch
    /// per column, every array reserved once. A read, not a mapping: mapping the pages
    /// and unmapping them when the window is evicted (every epoch of a dataset larger
    /// than the map budget) cost more than the copy into a buffer the CPU caches keep
    /// (W1 `iter_batches`: 1.1x to 1.7x in alternating runs on the CI machine).
    /// Returns the samples taken and their records' bytes; 0 when the first sample is
    /// not so (or its range is not all resident, or its record does not split, or its
    /// metadata row holds a null): `takeMapped`'s steps then take it, reporting any
    /// failure as before. Only running out of memory fails.
    fn takeAdjacent(it: *Iter, end: u64) error{OutOfMemory}!struct { u64, u64 } {
        std.debug.assert(it.used == 0 and it.planned == it.delivered and it.delivered < end);
        const ds = it.ds;
        if (ds.options.shuffle or it.table.cache.len != 0) return .{ 0, 0 };
        if (!it.batch.stored_metadata or ds.options.validate_cache) return .{ 0, 0 };
        const k0 = it.delivered;
        const pool = &ds.runtime.pool;
        // The run from the read-ahead when its oldest one continues at `k0` (what is left
        // of it after the previous batch), else planned and read now: its bytes (from
        // `at`), its records' lengths, where their payloads start in `bytes` (for the
        // `split` records that split) and its first sample.
        var bytes: []const u8 = undefined;
        var at: usize = 0;
        var lens: []const u64 = undefined;
        var starts: []const u32 = undefined;
        var split: usize = undefined;
        var first_id: u64 = undefined;
        var cache: u32 = undefined;
        var ahead = false;
        if (it.ahead.front()) |s| {
            const taken = it.ahead.taken;
            const continues = s.run.first + taken == k0;
            if (if (continues) s.bytes(pool) else null) |run_bytes| {
                // Split by the read, on the core that read it.
                bytes = run_bytes;
                at = @intCast(it.ahead.taken_bytes);
                lens = s.lens[taken..s.run.count];
                starts = s.starts[taken..s.run.count];
                split = s.split -| taken;
                first_id = s.run.sample_id + taken;
                cache = s.run.key.cache;
                ahead = true;
            } else {
                it.ahead.clear(pool, &it.files);
                // Not all in the page cache: the usual paths read it (and their errors).
                if (continues) return .{ 0, 0 };
            }
        }
        if (!ahead) {
            const run = it.planRun(k0, end, it.adjacent_lens) orelse return .{ 0, 0 };
            bytes = it.readAdjacent(run.key, run.len, run.offset) orelse return .{ 0, 0 };
            lens = it.adjacent_lens[0..run.count];
            starts = it.adjacent_starts;
            split = adjacent_mod.splitRun(bytes, lens, it.adjacent_starts);
            first_id = run.sample_id;
            cache = run.key.cache;
        }
        // The runs after this one go to the pool while this one is copied.
        try it.queueAhead(k0 + lens.len);
        // The records that split (the first that does not ends the run), within the window.
        split = @min(split, lens.len, end - k0);
        const payloads = it.adjacent_payloads;
        for (payloads[0..split], lens[0..split], starts[0..split]) |*payload, len, start| {
            at += @intCast(len);
            payload.* = bytes[start..at];
        }
        const added = it.batch.addRun(ds, cache, first_id, payloads[0..split], false) catch |err| switch (err) {
            error.OutOfMemory => return error.OutOfMemory,
            // Nothing was added; `addCopy` meets the same failure for this record.
            else => return .{ 0, 0 },
        };
        var added_bytes: u64 = 0;
        for (lens[0..added]) |len| added_bytes += len;
        it.delivered += added;
        it.planned += added;
        it.adjacent_records += added;
        if (ahead) it.ahead.take(&it.files, @intCast(added), added_bytes);
        return .{ added, added_bytes };
    }

    /// The run of `takeAdjacent` at plan index `k` (before `end`), its records' lengths
    /// written to `lens`: consecutive samples of one cache whose records lie back to back
    /// in one uncompressed local shard, each one `mappedRecord` would serve, at most
    /// `adjacent_read_max` bytes and `adjacent_records_max` records. Null when the record
    /// at `k` is not so. Reads nothing but index rows.
    fn planRun(it: *const Iter, k: u64, end: u64, lens: []u64) ?adjacent_mod.Run {
        const ds = it.ds;
        const table = it.table;
        const p0 = it.schedule.position(k);
        const loc = ds.locate(table, p0);
        const c = &ds.caches[loc.cache];
        // Consecutive plan indexes are consecutive samples while the positions do not
        // leave the schedule's block or wrap, and the rows stay in the table and the cache.
        var n_max: u64 = @min(end - k, adjacent_records_max, table.len - p0 % table.len, c.sampleCount() - loc.sample_id);
        n_max = @min(n_max, std.math.maxInt(u64) - p0);
        if (it.schedule.block_len != 0) n_max = @min(n_max, it.schedule.block_len - k % it.schedule.block_len);
        const first = c.row(loc.sample_id);
        if (!it.smallLocal(c, first)) return null;
        const entry = &c.manifest.shards[@intCast(first.shard_id)];
        if (entry.compression != .none) return null;
        var range_end = first.offset;
        var n: usize = 0;
        while (n < n_max) : (n += 1) {
            const row = if (n == 0) first else c.row(loc.sample_id + n);
            // `smallLocal` (its shard test is the first row's) and `Row.within`.
            if (row.shard_id != first.shard_id or row.offset != range_end) break;
            if (row.byte_len == 0 or row.byte_len >= it.map_max) break;
            if (!row.within(entry.byte_len)) break;
            if (range_end + row.byte_len - first.offset > adjacent_read_max) break;
            range_end += row.byte_len;
            lens[n] = row.byte_len;
        }
        if (n == 0) return null;
        return .{
            .key = .{ .cache = loc.cache, .shard_id = first.shard_id },
            .offset = first.offset,
            .len = range_end - first.offset,
            .first = k,
            .sample_id = loc.sample_id,
            .count = n,
        };
    }

    /// Hands the pool the reads of the runs from plan index `k` on (or after the runs it
    /// has), while the read-ahead has free slots and the window goes on.
    fn queueAhead(it: *Iter, k: u64) error{OutOfMemory}!void {
        if (it.ahead.slots.len == 0) {
            const depth = std.math.clamp(it.budget / adjacent_read_max, adjacent_ahead_min, adjacent_ahead_max);
            it.ahead = try .init(it.ds.gpa, @intCast(depth), adjacent_read_max, adjacent_records_max);
        }
        var next = it.ahead.end() orelse k;
        while (next < it.schedule.count) {
            const s = it.ahead.next() orelse return;
            const run = it.planRun(next, it.schedule.count, s.lens) orelse return;
            if (!it.ahead.push(&it.ds.runtime.pool, &it.files, Dataset.ShardOpener{ .ds = it.ds }, run)) return;
            next = run.end();
        }
    }

    /// `takeAdjacent`'s range: `len` bytes at `offset` of shard `key`, read into
    /// `adjacent_bytes` only if they are all in the page cache now (`readResident`; cold
    /// bytes go through the backend, with many reads in flight), else null. A file
    /// shorter than its manifest length reads short: null, and the record that is cut is
    /// reported by the slots.
    fn readAdjacent(it: *Iter, key: files_mod.Key, len: u64, offset: u64) ?[]const u8 {
        const handle = it.files.acquire(key, Dataset.ShardOpener{ .ds = it.ds }) catch return null;
        defer it.files.release(handle);
        const buf = it.adjacent_bytes[0..@intCast(len)];
        return if (files_mod.readResident(handle.fd, buf, offset)) buf else null;
    }

    /// `ds.locate` of the plan indexes `first..first + locs.len`. An ordered window over
    /// the physical samples (no shuffle, no table of identities) steps from one sample
    /// to the next (the next sample id of the same cache, while the stream position, its
    /// row and its cache do not wrap or end) instead of a division and a cache search per
    /// sample; any other window, and every wrap, locates the sample anew.
    fn locateStep(it: *const Iter, first: u64, locs: []Loc) void {
        const ds = it.ds;
        const table = it.table;
        if (locs.len == 0) return;
        if (ds.options.shuffle or table.cache.len != 0) {
            for (locs, first..) |*loc, k| loc.* = ds.locate(table, it.schedule.position(k));
            return;
        }
        var p = it.schedule.position(first);
        var row = p % table.len;
        locs[0] = ds.locate(table, p);
        for (1..locs.len) |j| {
            const prev = locs[j - 1];
            const next_p = it.schedule.position(first + j);
            if (next_p == p +% 1 and row + 1 < table.len and prev.sample_id + 1 < ds.caches[prev.cache].sampleCount()) {
                locs[j] = .{ .cache = prev.cache, .sample_id = prev.sample_id + 1 };
                row += 1;
            } else {
                locs[j] = ds.locate(table, next_p);
                row = next_p % table.len;
            }
            p = next_p;
        }
    }

    /// For `takeMapped` (nothing planned ahead): the leading records at `locs` that lie
    /// back to back in one uncompressed shard, each one `mappedRecord` would serve, from
    /// one `Maps.get` of their whole range (one window lookup and residency check instead
    /// of one per record). Sets their `images`; returns how many (0 when fewer than two,
    /// or the range is not served: then each record is looked up alone).
    fn mappedAdjacent(it: *Iter, locs: []const Loc, images: [][]const u8) usize {
        std.debug.assert(it.used == 0 and it.planned == it.delivered and locs.len <= mapped_step);
        if (locs.len < 2) return 0;
        const ds = it.ds;
        const c = &ds.caches[locs[0].cache];
        const first = c.row(locs[0].sample_id);
        const entry = &c.manifest.shards[@intCast(first.shard_id)];
        if (entry.compression != .none) return 0;
        var end = first.offset;
        var lens: [mapped_step]u64 = undefined;
        var n: usize = 0;
        while (n < locs.len) : (n += 1) {
            if (locs[n].cache != locs[0].cache) break;
            const row = c.row(locs[n].sample_id);
            if (row.shard_id != first.shard_id or row.offset != end) break;
            if (!it.smallLocal(c, row)) break;
            // Within the shard (a corrupt index row may point anywhere): a record that
            // is not is left to `mappedRecord`, which refuses it, and the slots report it.
            if (!row.within(entry.byte_len)) break;
            end += row.byte_len;
            lens[n] = row.byte_len;
        }
        if (n < 2) return 0;
        const key: files_mod.Key = .{ .cache = locs[0].cache, .shard_id = first.shard_id };
        // Stamped with the first record's plan index; `pinned_from` as in `mappedRecord`.
        const bytes = it.maps.get(ds.gpa, key, entry.byte_len, first.offset, end - first.offset, &it.files, Dataset.ShardOpener{ .ds = ds }, .{
            .now = it.planned,
            .pinned_from = it.planned,
            .resident_only = true,
        }) orelse return 0;
        var at: usize = 0;
        for (lens[0..n], images[0..n]) |len, *image| {
            image.* = bytes[at..][0..@intCast(len)];
            at += @intCast(len);
        }
        return n;
    }

    /// `takeMapped`'s bulk copy: adds the leading records of `images` (mapped, located at
    /// `locs`) that are consecutive samples of one cache and split cleanly, with one
    /// `Buffers.addRun`. Returns the samples added (0: add the first one alone, which
    /// reports any failure as `addCopy` does); only running out of memory fails.
    fn copyRun(it: *Iter, locs: []const Loc, images: []const []const u8) error{OutOfMemory}!usize {
        var payloads: [mapped_step][]const u8 = undefined;
        var n: usize = 0;
        while (n < locs.len) : (n += 1) {
            if (n > 0 and (locs[n].cache != locs[0].cache or locs[n].sample_id != locs[0].sample_id + n)) break;
            const rec = shard.split(images[n]) catch break;
            payloads[n] = rec.stored_payload;
        }
        return it.batch.addRun(it.ds, locs[0].cache, locs[0].sample_id, payloads[0..n], false) catch |err| switch (err) {
            error.OutOfMemory => error.OutOfMemory,
            // Nothing was added; `addCopy` meets the same failure for this record.
            else => 0,
        };
    }

    /// Contiguous batches into the caller's memory, with nothing planned ahead: appends up
    /// to `wanted` (at most `prefetch_size`) next samples whose records are large
    /// (`direct_record_min`) and uncompressed, reading each payload with the backend
    /// straight into `dest` (the record's 8-byte header is read first, to find it, only
    /// when it is in the page cache), so it is copied once, by the backend's threads,
    /// and the consumer copies nothing.
    /// Metadata from `metadata.arrow` (stored metadata only, no `validate_cache`). Stops
    /// at the first record that is not so, or whose header or row the slots must handle
    /// (a short file, a bad header, a null in its row: the slots read it and report it
    /// as usual), or that does not fit in `dest`. Waits for every read it queued before
    /// it returns, errors included (`dest` is the caller's). A read that fails after
    /// samples of this batch is deferred like `deliver`'s. Returns the samples taken.
    fn takeDirect(it: *Iter, wanted: u64) status.Error!u64 {
        std.debug.assert(it.used == 0 and it.planned == it.delivered and it.head_taken == 0);
        const ds = it.ds;
        if (!it.batch.stored_metadata or ds.options.validate_cache or ds.options.remote != null) return 0;
        const end = @min(it.schedule.count, it.delivered +| @min(wanted, it.direct.len));
        const first = it.batch.count();
        var n: usize = 0;
        // The backend starts reads as they are prepared; this thread runs the rest.
        var shared = io.Shared(DirectRead, "read").init(&it.io);
        // Reads that hold a descriptor: `n`, or `n + 1` while the next one is set up.
        var held: usize = 0;
        // No read may still target `dest` once this returns.
        errdefer for (it.direct[0..held]) |*d| {
            it.io.cancel(&d.read);
            it.releaseDirect(d);
        };
        while (it.delivered + n < end) : (n += 1) {
            if (!it.batch.in_dest) break;
            const loc = ds.locate(it.table, it.schedule.position(it.delivered + n));
            const c = &ds.caches[loc.cache];
            const row = c.row(loc.sample_id);
            const entry = &c.manifest.shards[@intCast(row.shard_id)];
            if (entry.compression != .none or row.byte_len < it.direct_min) break;
            if (!row.within(entry.byte_len)) break;
            const handle = (it.files.acquireWithin(.{ .cache = loc.cache, .shard_id = row.shard_id }, Dataset.ShardOpener{ .ds = ds }) catch break) orelse break;
            // Only from the page cache: a header read that waited for the disk would
            // serialize cold reads on this thread (the slots keep many in flight).
            var header: [shard.header_bytes]u8 = undefined;
            const resident = files_mod.readResident(handle.fd, &header, row.offset);
            const json_len = std.mem.readInt(u64, &header, .little);
            if (!resident or json_len > row.byte_len - shard.header_bytes) {
                it.files.release(handle);
                break;
            }
            _ = ds.bytes_read.fetchAdd(header.len, .monotonic);
            const payload_len: usize = @intCast(row.byte_len - shard.header_bytes - json_len);
            const space = it.batch.claimDest(payload_len) orelse {
                it.files.release(handle);
                break;
            };
            const added = it.batch.addPlaced(ds, loc, space) catch |err| blk: {
                if (err == error.OutOfMemory) {
                    it.batch.unclaim(payload_len);
                    it.files.release(handle);
                    return err;
                }
                break :blk false; // the slots meet the same failure and report it
            };
            if (!added) {
                it.batch.unclaim(payload_len);
                it.files.release(handle);
                break;
            }
            const d = &it.direct[n];
            d.file = handle;
            held = n + 1;
            d.cache = loc.cache;
            d.shard_id = row.shard_id;
            d.read.prepare(handle.fd, space, row.offset + shard.header_bytes + json_len);
            if (space.len == 0) {
                // Nothing to read: done, and ok.
                d.read.result = .ok;
                d.read.skip();
            }
            try shared.feed(&it.io, it.direct[0 .. n + 1], n + 1);
        }
        // This thread would only wait for the reads: on io_uring it runs some of them
        // itself, so two cores copy where io-wq would use one.
        try shared.finish(&it.io, it.direct[0..n]);
        var ok: usize = n;
        for (it.direct[0..n], 0..) |*d, k| {
            if (ok == n and d.read.result != .ok) ok = k;
        }
        var failure: ?status.Error = null;
        if (ok < n) {
            const d = &it.direct[ok];
            const path = ds.caches[d.cache].shard_paths[@intCast(d.shard_id)];
            failure = switch (d.read.result) {
                .os => |e| status.failErrno(e, path),
                else => status.fail(error.Io, "I/O error: failed to fill whole buffer: {s}", .{path}),
            };
        }
        for (it.direct[0..n]) |*d| it.releaseDirect(d);
        held = 0; // nothing left for the errdefer
        if (failure) |err| {
            it.batch.truncate(ds.fields, first + ok);
            if (it.batch.count() == 0) return err;
            it.deferFailure(err);
        }
        it.delivered += ok;
        it.planned += ok;
        it.direct_reads += ok;
        return ok;
    }

    fn releaseDirect(it: *Iter, d: *DirectRead) void {
        if (d.file) |handle| it.files.release(handle);
        d.file = null;
    }

    /// Appends up to `wanted` samples in plan order to the batch: waits for the oldest
    /// read, then takes whatever is already complete. A failure after samples of this
    /// batch were taken is deferred to the next call (the reference delivers the samples
    /// before a corrupt one first). With `bytes_max`, takes no slot after the first that
    /// would bring the slots' bytes past it. Returns the samples taken.
    fn deliver(it: *Iter, wanted: u64, bytes_max: ?u64) status.Error!u64 {
        const limit = @min(wanted, it.schedule.count - it.delivered);
        var taken: u64 = 0;
        var bytes: u64 = 0;
        var i: usize = 0;
        while (taken < limit and i < it.used) : (i += 1) {
            const slot = it.slotAt(i);
            if (i == 0) try it.io.wait(&slot.read) else if (!slot.read.isDone()) break;
            if (bytes_max) |m| {
                if (i > 0 and bytes +| slot.span.len > m) break;
            }
            bytes +|= slot.span.len;
            std.debug.assert(slot.span.first + (if (i == 0) it.head_taken else 0) == it.delivered + taken);
            var k: u32 = if (i == 0) it.head_taken else 0;
            while (k < slot.span.count and taken < limit) : (k += 1) {
                // Records decoded before a slot's failure are still delivered.
                const added = if (k < slot.decoded.items.len)
                    it.addSample(slot, k)
                else
                    status.failText(slot.failure.?, slot.message.items);
                added catch |err| {
                    if (taken == 0 and it.batch.count() == 0) return err;
                    it.deferFailure(err);
                    break;
                };
                taken += 1;
            }
            if (it.deferred != null or k < slot.span.count) {
                // Partly delivered: once the slots before it are released it is the head.
                it.head_taken = k;
                break;
            }
            it.head_taken = 0;
            it.pending_release += 1;
        }
        it.delivered += taken;
        return taken;
    }

    pub fn close(it: *Iter) void {
        const ds = it.ds;
        if (ds.runtime.checkPid()) |_| {} else |_| return; // forked child: leak, never touch
        const gpa = ds.gpa;
        // No read may target a buffer once it is freed.
        for (it.slots) |*s| it.io.cancel(&s.read);
        for (it.slots) |*s| it.releaseFile(s);
        for (it.direct) |*d| {
            it.io.cancel(&d.read);
            it.releaseDirect(d);
        }
        it.io.deinit();
        it.ahead.clear(&ds.runtime.pool, &it.files);
        it.ahead.deinit(gpa);
        for (&it.staged) |*f| {
            f.release(&ds.runtime.pool, &it.files);
            f.deinit(gpa);
        }
        it.hints.deinit(&it.files);
        it.files.deinit();
        it.maps.deinit(gpa);
        for (it.slots) |*s| s.deinit(gpa);
        it.ring.deinit(gpa);
        it.dests.deinit(gpa);
        gpa.free(it.slots);
        gpa.free(it.direct);
        gpa.free(it.adjacent_lens);
        gpa.free(it.adjacent_starts);
        gpa.free(it.adjacent_payloads);
        mem_mod.freeUninit(gpa, it.adjacent_bytes);
        gpa.free(it.loc_ring);
        it.batch.deinit(gpa);
        ds.giveSpare(it.own_dest);
        it.table.release();
        gpa.destroy(it);
        ds.release();
    }
};

// ---------------------------------------------------------------- tests

const testing = std.testing;
const helpers = @import("testing.zig");

/// Whole windows equal expected.json for every prefetch size, ordered and shuffled, in
/// batches of 1, 7 and more than an epoch, slot-backed and contiguous, read through the
/// backend and (the fixtures' pages are in the page cache once read) from the mappings.
fn expectEpochs(backend: io.Kind) !void {
    const gpa = testing.allocator;
    for ([_]u64{ 1, 2, 3, 64 }) |prefetch| {
        for ([_]bool{ false, true }) |shuffle| {
            var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{ .backend = backend, .prefetch_size = prefetch, .shuffle = shuffle });
            defer env.close();
            for ([_]bool{ false, true }) |mapped| {
                for ([_]u64{ 1, 7, 1 << 20 }) |max_count| {
                    for ([_]bool{ false, true }) |contiguous| {
                        errdefer std.debug.print("prefetch {d} shuffle {} mapped {} max_count {d} contiguous {}\n", .{ prefetch, shuffle, mapped, max_count, contiguous });
                        const it = try env.openIter();
                        defer it.close();
                        if (!mapped) it.map_max = 0;
                        try testing.expectEqual(env.total(), try env.expectEpoch(it, max_count, contiguous));
                        if (mapped) {
                            try testing.expect(it.mapped_records > 0);
                        } else try testing.expectEqual(@as(u64, 0), it.mapped_records);
                    }
                }
            }
            // Every read went through the backend asked for.
            const stats = env.ds.ioStats();
            const mine, const other = switch (backend) {
                .io_uring => .{ stats.uring_reads, stats.pool_reads },
                .threads => .{ stats.pool_reads, stats.uring_reads },
            };
            try testing.expect(mine > 0);
            try testing.expectEqual(@as(u64, 0), other);
        }
    }
    // Another schema (label, split), and the permutation sampler.
    for ([_]bool{ false, true }) |permutation| {
        var env = try helpers.Env.openFixtures(gpa, &.{"text_records_v1"}, .{ .backend = backend, .prefetch_size = 2, .shuffle = permutation, .permutation = permutation });
        defer env.close();
        for ([_]bool{ false, true }) |contiguous| {
            const it = try env.openIter();
            defer it.close();
            try testing.expectEqual(@as(u64, 2), try env.expectEpoch(it, 1, contiguous));
        }
    }
}

test "iterator (io_uring): whole epochs equal expected.json for every prefetch, mode and batch shape" {
    try expectEpochs(.io_uring);
}

test "iterator (threads): whole epochs equal expected.json for every prefetch, mode and batch shape" {
    try expectEpochs(.threads);
}

/// Explicit positions (openRange) read blocks of the stream and leave its position alone;
/// bad arguments fail without finishing anything else.
fn expectRanges(backend: io.Kind) !void {
    // validate_cache: every sample's embedded metadata is also compared with metadata.arrow.
    var env = try helpers.Env.openFixtures(testing.allocator, &helpers.same_schema, .{ .backend = backend, .prefetch_size = 5, .validate_cache = true });
    defer env.close();
    // Batches of 2 of every third batch from position 700, wrapping past the last of the
    // 730 samples.
    const schedule: Schedule = .{ .start = 700, .count = 40, .block_len = 2, .block_stride = 6 };
    for ([_]bool{ false, true }) |contiguous| {
        const it = try Iter.openRange(env.ds, schedule);
        defer it.close();
        try testing.expectEqual(@as(u64, 40), try env.expectEpoch(it, 3, contiguous));
    }
    try testing.expectEqual(Dataset.Stream{ .position = 0, .window_end = 0 }, env.ds.stream());
    try testing.expectError(error.InvalidArgument, Iter.openRange(env.ds, .{ .start = 0, .count = 4, .block_len = 3, .block_stride = 2 }));
    const it = try env.openIter();
    defer it.close();
    try testing.expectError(error.InvalidArgument, it.nextBatch(0, false));
    try testing.expectEqualStrings("max_count must be at least 1", status.lastMessage());
}

/// nextBatchInto: the same samples and batch boundaries as contiguous batches, the
/// payloads in the caller's memory exactly when they all fit there (else in the arena),
/// whether records come from the mappings or through the backend.
fn expectBatchesInto(backend: io.Kind) !void {
    const gpa = testing.allocator;
    const dest = try gpa.alloc(u8, 1 << 20);
    defer gpa.free(dest);
    for ([_]u64{ 1, 3, 64 }) |prefetch| {
        for ([_]bool{ false, true }) |shuffle| {
            var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{ .backend = backend, .prefetch_size = prefetch, .shuffle = shuffle });
            defer env.close();
            // Records from shard mappings (one at a time, or with stored metadata as the
            // batch APIs ask for, in runs: `takeAdjacent`), through the slots, or read
            // straight into `dest` (`takeDirect`, with stored metadata).
            for ([_]enum { mapped, adjacent, slots, direct }{ .mapped, .adjacent, .slots, .direct }) |path| {
                var direct_reads: u64 = 0;
                var adjacent_records: u64 = 0;
                var ahead_runs: u64 = 0;
                for ([_]u64{ 1, 7, 100 }) |max_count| {
                    // No room, room for about half a batch, room for every batch.
                    for ([_]usize{ 0, 700, dest.len }) |room| {
                        errdefer std.debug.print("prefetch {d} shuffle {} path {s} max_count {d} room {d}\n", .{ prefetch, shuffle, @tagName(path), max_count, room });
                        const it = try env.openIter();
                        defer it.close();
                        if (path == .slots or path == .direct) it.map_max = 0;
                        if (path == .direct) it.direct_min = 1;
                        if (path == .direct or path == .adjacent) it.batch.stored_metadata = true;
                        defer direct_reads += it.direct_reads;
                        defer adjacent_records += it.adjacent_records;
                        defer ahead_runs += it.ahead.queued_runs;
                        var k: u64 = 0;
                        var placed: u64 = 0;
                        while (true) {
                            @memset(dest, '!');
                            const view = try it.nextBatchInto(max_count, dest[0..room]);
                            if (view.count == 0) break;
                            try testing.expectEqual(@min(max_count, it.schedule.count - k), view.count);
                            var total: u64 = 0;
                            for (0..@intCast(view.count)) |i| {
                                try env.expectSample(view, i, env.expectedLoc(it, k + i));
                                try testing.expectEqual(total, view.payload_offsets.?[i]);
                                total += view.payload_lens.?[i];
                            }
                            const in_dest = view.payload_base.? == dest.ptr;
                            try testing.expectEqual(room > 0 and total <= room, in_dest);
                            if (in_dest) placed += 1;
                            k += view.count;
                        }
                        try testing.expectEqual(it.schedule.count, k);
                        if (room == dest.len) try testing.expect(placed > 0);
                    }
                }
                // The uncompressed caches' records went straight into `dest`; ordered
                // windows took runs of mapped records.
                if (path == .direct) try testing.expect(direct_reads > 0);
                if (path == .adjacent) try testing.expectEqual(!shuffle, adjacent_records > 0);
                if (path != .adjacent) try testing.expectEqual(@as(u64, 0), adjacent_records);
                // The runs after the first were read ahead on the pool (batches of 1 and 7
                // take them a piece at a time).
                try testing.expectEqual(path == .adjacent and !shuffle, ahead_runs > 0);
                if (path == .adjacent and !shuffle) {
                    // Closed after one sample, with runs queued or being read: nothing
                    // leaks (the allocator checks) and no worker writes a freed buffer.
                    const it = try env.openIter();
                    it.batch.stored_metadata = true;
                    const view = try it.nextBatchInto(1, dest);
                    try env.expectSample(view, 0, env.expectedLoc(it, 0));
                    try testing.expect(it.ahead.count > 0);
                    it.close();
                }
            }
        }
    }
}

/// Ordered contiguous batches with stored metadata over shards evicted from the page
/// cache: `takeAdjacent` reads a run only when all its bytes are resident (`readResident`
/// refuses to wait for the disk), so the first record is read through the slots; the
/// same samples either way. An `RWF_NOWAIT` read of evicted bytes still starts the
/// kernel's read-ahead, and a fast disk can finish it before the same call looks at the
/// pages again (more often on a loaded machine): the first record is then read in a run,
/// legitimately. So the eviction and the first batch are tried up to 20 times, and one
/// try must take the first record through the slots (a `pread` in place of the
/// residency check takes it in a run every time).
fn expectAdjacentEvicted(backend: io.Kind) !void {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{ .backend = backend, .prefetch_size = 64 });
    defer env.close();
    var slots_seen = false;
    var attempts: usize = 0;
    while (attempts < 20 and !slots_seen) : (attempts += 1) {
        // Out of the page cache where the file system lets the pages go (a shard still
        // cached makes this try moot, not wrong).
        var evicted = true;
        for (env.ds.caches) |*c| {
            for (c.shard_paths, c.manifest.shards) |path, entry| {
                const file = try std.fs.cwd().openFile(path, .{});
                defer file.close();
                _ = std.os.linux.fadvise(file.handle, 0, 0, std.os.linux.POSIX_FADV.DONTNEED);
                if (entry.byte_len > 0 and files_mod.rangeCached(file.handle, 0, @min(entry.byte_len, 4096))) evicted = false;
            }
        }
        if (!evicted) return; // the file system keeps the pages: nothing to check
        const it = try env.openIter();
        defer it.close();
        it.batch.stored_metadata = true;
        var dest: [1 << 16]u8 = undefined;
        var k: u64 = 0;
        while (true) {
            // The first record alone: it waits for the disk (then the kernel's read-ahead
            // may bring the rest of a small shard in, for the runs after it).
            const view = try it.nextBatchInto(if (k == 0) 1 else 100, &dest);
            if (view.count == 0) break;
            if (k == 0) slots_seen = it.adjacent_records == 0;
            for (0..@intCast(view.count)) |i| try env.expectSample(view, i, env.expectedLoc(it, k + i));
            k += view.count;
        }
        try testing.expectEqual(it.schedule.count, k);
    }
    try testing.expect(slots_seen);
}

test "iterator (io_uring): runs of adjacent records wait for nothing evicted" {
    try expectAdjacentEvicted(.io_uring);
}

test "iterator (threads): runs of adjacent records wait for nothing evicted" {
    try expectAdjacentEvicted(.threads);
}

/// Contiguous batches without caller memory (`nextBatch`): after a batch that did not fit
/// `own_dest` (the first one: it starts empty), `own_dest` holds the batches, large records
/// read straight into it (`takeDirect`); closing gives it to the dataset, and the next
/// iterator's first batch lands in it. The same samples whichever memory holds them; the
/// allocator checks nothing leaks.
fn expectOwnDest(backend: io.Kind) !void {
    const gpa = testing.allocator;
    // One record in flight: the slots are empty when a batch starts, so `takeDirect` runs.
    var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{ .backend = backend, .prefetch_size = 1 });
    defer env.close();
    for (0..2) |round| {
        const it = try env.openIter();
        defer it.close();
        try testing.expectEqual(round == 1, it.own_dest.len > 0); // the first iterator's, given back
        it.map_max = 0;
        it.direct_min = 1;
        it.batch.stored_metadata = true;
        var k: u64 = 0;
        var in_own: u64 = 0;
        while (true) {
            const view = try it.nextBatch(7, true);
            if (view.count == 0) break;
            for (0..@intCast(view.count)) |i| try env.expectSample(view, i, env.expectedLoc(it, k + i));
            const own = it.own_dest.len > 0 and view.payload_base.? == it.own_dest.ptr;
            if (k == 0) try testing.expectEqual(round == 1, own);
            if (own) in_own += 1;
            k += view.count;
        }
        try testing.expectEqual(it.schedule.count, k);
        try testing.expect(in_own > 0 and it.direct_reads > 0);
    }
}

test "iterator (io_uring): contiguous batches reuse their own memory across iterators" {
    try expectOwnDest(.io_uring);
}

test "iterator (threads): contiguous batches reuse their own memory across iterators" {
    try expectOwnDest(.threads);
}

test "iterator (io_uring): batches into the caller's memory" {
    try expectBatchesInto(.io_uring);
}

test "iterator (threads): batches into the caller's memory" {
    try expectBatchesInto(.threads);
}

/// givePayloadBuffers: a sample whose payload is exactly as long as the first buffer not
/// yet assigned (uncompressed, read through the backend) is read into it, in order; any
/// other sample is read as usual; resets drop the unassigned buffers. Whatever the
/// buffers, the same samples, bytes and metadata, and the assigned buffers come back
/// in the order given.
fn expectPayloadBuffers(backend: io.Kind) !void {
    const gpa = testing.allocator;
    var used: u64 = 0;
    for ([_]u64{ 1, 3, 64 }) |prefetch| {
        for ([_]bool{ false, true }) |shuffle| {
            errdefer std.debug.print("prefetch {d} shuffle {}\n", .{ prefetch, shuffle });
            var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{ .backend = backend, .prefetch_size = prefetch, .shuffle = shuffle });
            defer env.close();
            // Every buffer made (freed after the iterator is closed), and the model of the
            // iterator's queue: `given[front..]` in order, the first `taken - popped`
            // of them assigned.
            var all: std.ArrayList([]u8) = .empty;
            defer {
                for (all.items) |b| gpa.free(b);
                all.deinit(gpa);
            }
            var given: std.ArrayList([]u8) = .empty;
            defer given.deinit(gpa);
            var front: usize = 0;
            var popped: u64 = 0;
            const it = try env.openIter();
            defer it.close();
            it.map_max = 0;
            it.direct_min = 1;
            var k: u64 = 0;
            var sized: u64 = 0; // window index the next buffer is sized for
            var round: u64 = 0;
            while (true) : (round += 1) {
                // Buffers for the next few samples, sized for them; every 7th one byte
                // too long (no sample takes it until a reset drops it).
                var fresh: [4][]u8 = undefined;
                var n: usize = 0;
                while (n < fresh.len and sized < it.schedule.count) : (n += 1) {
                    const loc = env.expectedLoc(it, sized);
                    const want = env.expected[loc.cache].samples()[@intCast(loc.sample_id)];
                    const len: usize = @intCast(want.len + @intFromBool(sized % 7 == 6));
                    fresh[n] = try gpa.alloc(u8, len);
                    try all.append(gpa, fresh[n]);
                    sized += 1;
                }
                const reset = round % 3 == 2;
                const taken = try it.givePayloadBuffers(fresh[0..n], reset);
                const assigned: usize = @intCast(taken - popped);
                if (reset) given.items.len = front + assigned;
                try given.appendSlice(gpa, fresh[0..n]);
                const view = try it.nextBatch(1 << 20, false);
                if (view.count == 0) break;
                for (0..@intCast(view.count)) |i| {
                    try env.expectSample(view, i, env.expectedLoc(it, k + i));
                    const p = view.payloads.?[i];
                    if (front < given.items.len and given.items[front].ptr == p and given.items[front].len > 0) {
                        try testing.expectEqual(@as(u64, given.items[front].len), view.payload_lens.?[i]);
                        front += 1;
                        popped += 1;
                        used += 1;
                    } else {
                        for (given.items[front..]) |b| try testing.expect(b.ptr != p);
                    }
                }
                k += view.count;
                // Assigned buffers are delivered in order: none skipped.
                try testing.expect(it.dests_taken >= popped);
                try testing.expect(it.dests_taken - popped <= given.items.len - front);
            }
            try testing.expectEqual(it.schedule.count, k);
            try testing.expectEqual(it.dests_taken, popped);
        }
    }
    try testing.expect(used > 0);
}

/// Staged batches (`stageBatch`): read as a caller that stages up to two batches ahead
/// in memory of their own would (Python's `iter_batches`), every batch holds the samples
/// unstaged batches hold, in the caller's memory; a call into other memory drops the
/// staged batches and still reads right; nothing is staged for shuffled windows or one
/// worker; closing with batches staged leaks nothing. With a corrupt record (sample 5's
/// JSON length), the staged batches end before it and the error comes where it does
/// without staging.
fn expectStagedBatches(backend: io.Kind) !void {
    const gpa = testing.allocator;
    var bufs: [3][]u8 = undefined;
    for (&bufs) |*b| b.* = try gpa.alloc(u8, 1 << 16);
    defer for (bufs) |b| gpa.free(b);
    const Run = struct {
        /// Reads a window to its end or first error, staging as it goes (every
        /// `drop_every`-th call goes into memory nothing was staged in). Returns the
        /// samples read, and whether the read ended in an error.
        fn read(env: *helpers.Env, it: *Iter, bs: *[3][]u8, max_count: u64, drop_every: u64, whole: bool) !struct { u64, bool } {
            var staged: [2]usize = undefined;
            var n_staged: usize = 0;
            var k: u64 = 0;
            var call: u64 = 0;
            while (true) : (call += 1) {
                const drop = drop_every != 0 and call % drop_every == drop_every - 1;
                var into: usize = 0;
                if (n_staged > 0 and !drop) {
                    into = staged[0];
                    staged[0] = staged[1];
                    n_staged -= 1;
                } else {
                    // Memory no staged batch uses; the call drops the staged ones.
                    into = for (0..3) |b| {
                        if (std.mem.indexOfScalar(usize, staged[0..n_staged], b) == null) break b;
                    } else unreachable;
                    n_staged = 0;
                }
                const view = it.nextBatchInto(max_count, bs[into]) catch return .{ k, true };
                if (view.count == 0) return .{ k, false };
                // (A batch ends before a failing record.)
                if (whole) try testing.expectEqual(@min(max_count, it.schedule.count - k), view.count);
                try testing.expect(view.payload_base.? == bs[into].ptr);
                var total: u64 = 0;
                for (0..@intCast(view.count)) |i| {
                    try env.expectSample(view, i, env.expectedLoc(it, k + i));
                    try testing.expectEqual(total, view.payload_offsets.?[i]);
                    total += view.payload_lens.?[i];
                }
                k += view.count;
                // Up to two batches ahead, each in memory the others do not use.
                while (n_staged < 2) {
                    const b = for (0..3) |b| {
                        if (b != into and std.mem.indexOfScalar(usize, staged[0..n_staged], b) == null) break b;
                    } else unreachable;
                    const needed = try it.stageBatch(max_count, bs[b]);
                    if (needed == 0 or needed > bs[b].len) break;
                    staged[n_staged] = b;
                    n_staged += 1;
                }
            }
        }
    };
    // Staged runs copied out of the dataset's shard mappings (`mapped`), or read (a
    // mapping budget of 0: no shard is mapped).
    for ([_]bool{ false, true }) |shuffle| for ([_]bool{ true, false }) |mapped| {
        var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{ .backend = backend, .prefetch_size = 64, .shuffle = shuffle });
        defer env.close();
        if (!mapped) env.ds.shard_maps.budget = 0;
        for ([_]u64{ 1, 7, 100 }) |max_count| for ([_]u64{ 0, 3 }) |drop_every| {
            errdefer std.debug.print("shuffle {} mapped {} max_count {d} drop_every {d}\n", .{ shuffle, mapped, max_count, drop_every });
            const it = try env.openIter();
            defer it.close();
            it.batch.stored_metadata = true;
            it.stage_min = .{ .read = 0, .mapped = 0 };
            // Nothing before the first batch; asking (no memory) stages nothing.
            try testing.expectEqual(@as(u64, 0), try it.stageBatch(max_count, bufs[0]));
            const k, const failed = try Run.read(&env, it, &bufs, max_count, drop_every, true);
            try testing.expect(!failed);
            try testing.expectEqual(it.schedule.count, k);
            // Ordered windows' batches after the first were staged (the lz4 cache's
            // records are not: they are read the usual way).
            try testing.expectEqual(!shuffle, it.staged_records > 0);
            try testing.expectEqual(!shuffle and mapped, env.ds.shard_maps.mapped_bytes > 0);
        };
        // Closed with two batches staged: no worker writes freed memory, nothing leaks.
        const it = try env.openIter();
        it.batch.stored_metadata = true;
        try testing.expect(try it.stageBatch(2, bufs[1]) == 0); // before the first batch
        _ = try it.nextBatchInto(1, bufs[0]);
        // Too small to be worth staging at the default minimums.
        try testing.expectEqual(@as(u64, 0), try it.stageBatch(2, bufs[1]));
        // The minimum of batches read applies unless every run is copied out of a mapping.
        it.stage_min = .{ .read = std.math.maxInt(u64), .mapped = 0 };
        try testing.expectEqual(!shuffle and mapped, try it.stageBatch(2, &.{}) > 0);
        it.stage_min = .{ .read = 0, .mapped = 0 };
        try testing.expect(!shuffle or try it.stageBatch(2, &.{}) == 0);
        if (!shuffle) {
            try testing.expect(try it.stageBatch(2, &.{}) > 0); // only asks
            try testing.expect(!it.staged[0].active and !it.staged[1].active);
            try testing.expect(try it.stageBatch(2, bufs[1]) > 0);
            try testing.expect(try it.stageBatch(2, bufs[2]) > 0);
            try testing.expectEqual(@as(u64, 0), try it.stageBatch(2, bufs[0])); // two at most
        }
        it.close();
    };
    {
        // One worker: nothing is staged.
        var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{ .backend = backend, .prefetch_size = 64, .workers = 1 });
        defer env.close();
        const it = try env.openIter();
        defer it.close();
        it.batch.stored_metadata = true;
        it.stage_min = .{ .read = 0, .mapped = 0 };
        _ = try it.nextBatchInto(1, bufs[0]);
        try testing.expectEqual(@as(u64, 0), try it.stageBatch(2, bufs[1]));
    }
    // A corrupt record: the error comes after the samples before it, staged or not.
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    try helpers.copyFixture(gpa, tmp.dir, "plain_one_shard");
    const rows = try helpers.readIndex(gpa, tmp.dir, "plain_one_shard");
    defer gpa.free(rows);
    {
        const file = try tmp.dir.openFile("plain_one_shard/shards/000000.bin", .{ .mode = .read_write });
        defer file.close();
        var prefix: [8]u8 = undefined;
        std.mem.writeInt(u64, &prefix, 1 << 40, .little);
        try file.pwriteAll(&prefix, rows[5].offset);
    }
    const path = try tmp.dir.realpathAlloc(gpa, "plain_one_shard");
    defer gpa.free(path);
    for ([_]bool{ true, false }) |mapped| for ([_]u64{ 2, 3 }) |max_count| {
        var env = try helpers.Env.open(gpa, &.{path}, &.{"plain_one_shard"}, .{ .backend = backend, .prefetch_size = 64 });
        defer env.close();
        if (!mapped) env.ds.shard_maps.budget = 0;
        const it = try env.openIter();
        defer it.close();
        it.batch.stored_metadata = true;
        it.stage_min = .{ .read = 0, .mapped = 0 };
        const k, const failed = try Run.read(&env, it, &bufs, max_count, 0, false);
        try testing.expect(failed);
        // The record's error names its shard file.
        try testing.expect(std.mem.startsWith(u8, status.lastMessage(), "invalid binary record: "));
        try testing.expect(std.mem.endsWith(u8, status.lastMessage(), "plain_one_shard/shards/000000.bin"));
        // Batches before the corrupt record's whole, the one holding it cut before it.
        try testing.expectEqual(@as(u64, 5), k);
        try testing.expectEqual(mapped, env.ds.shard_maps.mapped_bytes > 0);
    };
}

test "iterator (io_uring): staged batches are read into the caller's memory ahead" {
    try expectStagedBatches(.io_uring);
}

test "iterator (threads): staged batches are read into the caller's memory ahead" {
    try expectStagedBatches(.threads);
}

test "iterator (io_uring): payloads read straight into caller buffers" {
    try expectPayloadBuffers(.io_uring);
}

test "iterator (threads): payloads read straight into caller buffers" {
    try expectPayloadBuffers(.threads);
}

test "byte ring: FIFO allocations wrap, never overlap, and grow only when empty" {
    const gpa = testing.allocator;
    var r: ByteRing = .{};
    defer r.deinit(gpa);
    const a = (try r.alloc(gpa, 40, 100)).?; // grows to the capacity
    try testing.expectEqual(@as(usize, 100), r.mem.len);
    const b = (try r.alloc(gpa, 50, 100)).?;
    try testing.expectEqual(@as(?[]u8, null), try r.alloc(gpa, 20, 100)); // 10 left at the end
    try testing.expectEqual(@as(usize, 90), r.inUse());
    r.free(a);
    // 40 free at the start, 10 at the end: wraps to the start.
    const c = (try r.alloc(gpa, 30, 100)).?;
    try testing.expectEqual(@intFromPtr(r.mem.ptr), @intFromPtr(c.ptr));
    try testing.expectEqual(@as(?usize, null), r.place(20)); // only 10 left before b
    @memset(c, 1);
    @memset(b, 2);
    try testing.expect(std.mem.allEqual(u8, c, 1) and std.mem.allEqual(u8, b, 2));
    r.free(b);
    try testing.expectEqual(@as(usize, 30), r.inUse());
    r.free(c);
    try testing.expectEqual(@as(usize, 0), r.inUse());
    // Empty: a read larger than the budget grows it; nothing else may be live then.
    const big = (try r.alloc(gpa, 500, 100)).?;
    try testing.expectEqual(@as(usize, 500), big.len);
    try testing.expectEqual(@as(?[]u8, null), try r.alloc(gpa, 1, 100));
    r.free(big);
}

/// Byte budgets from one byte (every read alone, each larger than the budget) to the
/// default: the same samples in the same order, and the read buffers within
/// `max(budget, largest read)`. Every record goes through the backend (records served
/// from mappings take no buffer).
fn expectBudgets(backend: io.Kind) !void {
    const gpa = testing.allocator;
    for ([_]u64{ 1, 300, 5000, 0 }) |budget| {
        for ([_]u64{ 1, 3, 64 }) |prefetch| {
            for ([_]bool{ false, true }) |shuffle| {
                var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{ .backend = backend, .prefetch_size = prefetch, .shuffle = shuffle });
                defer env.close();
                env.ds.setPrefetchBytes(budget);
                var largest: u64 = 0;
                for (env.ds.caches) |*c| {
                    for (0..c.sampleCount()) |sid| largest = @max(largest, c.row(sid).byte_len);
                }
                for ([_]u64{ 1, 7, 1 << 20 }) |max_count| {
                    for ([_]bool{ false, true }) |contiguous| {
                        errdefer std.debug.print("budget {d} prefetch {d} shuffle {} max_count {d} contiguous {}\n", .{ budget, prefetch, shuffle, max_count, contiguous });
                        const it = try env.openIter();
                        defer it.close();
                        it.map_max = 0;
                        try testing.expectEqual(env.total(), try env.expectEpoch(it, max_count, contiguous));
                        const want = if (budget == 0) env.ds.auto_prefetch_bytes else budget;
                        try testing.expectEqual(want, it.budget);
                        // Coalesced reads stay below a quarter of the budget plus one record.
                        try testing.expect(it.ring.mem.len <= @max(want, largest + want / 4));
                    }
                }
            }
        }
    }
}

test "iterator (io_uring): every byte budget reads the same stream within its bound" {
    try expectBudgets(.io_uring);
}

test "iterator (threads): every byte budget reads the same stream within its bound" {
    try expectBudgets(.threads);
}

/// DRT_BATCH_BOUNDED: contiguous batches asked for by count stop at about the byte
/// budget (one read, or one step of mapped records, beyond it) and still read the same
/// stream; without the flag a batch takes every sample asked for.
fn expectBoundedBatches(backend: io.Kind) !void {
    const gpa = testing.allocator;
    for ([_]u64{ 300, 5000 }) |budget| {
        for ([_]bool{ false, true }) |shuffle| {
            for ([_]bool{ false, true }) |mapped| {
                errdefer std.debug.print("budget {d} shuffle {} mapped {}\n", .{ budget, shuffle, mapped });
                var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{ .backend = backend, .prefetch_size = 64, .shuffle = shuffle });
                defer env.close();
                env.ds.setPrefetchBytes(budget);
                var largest: u64 = 0;
                for (env.ds.caches) |*c| {
                    for (0..c.sampleCount()) |sid| largest = @max(largest, c.row(sid).byte_len);
                }
                {
                    const it = try env.openIter();
                    defer it.close();
                    if (!mapped) it.map_max = 0;
                    it.batch.bounded = true;
                    try testing.expectEqual(env.total(), try env.expectEpoch(it, 1 << 20, true));
                }
                const it = try env.openIter();
                defer it.close();
                if (!mapped) it.map_max = 0;
                it.batch.bounded = true;
                var seen: u64 = 0;
                var batches: u64 = 0;
                while (true) {
                    const view = try it.nextBatch(1 << 20, true);
                    if (view.count == 0) break;
                    seen += view.count;
                    batches += 1;
                    try testing.expect(it.batch.payloadBytes() <= budget + mapped_step * largest);
                }
                try testing.expectEqual(env.total(), seen);
                // The fixtures hold more than one budget's bytes: several batches.
                try testing.expect(batches > 1);
            }
        }
    }
}

test "iterator (io_uring): bounded contiguous batches stop at the byte budget" {
    try expectBoundedBatches(.io_uring);
}

test "iterator (threads): bounded contiguous batches stop at the byte budget" {
    try expectBoundedBatches(.threads);
}

test "iterator (io_uring): explicit ranges, with validate_cache" {
    try expectRanges(.io_uring);
}

test "iterator (threads): explicit ranges, with validate_cache" {
    try expectRanges(.threads);
}

/// Closing an iterator that never read, or has reads planned beyond what it delivered,
/// frees every buffer (std.testing.allocator checks) and closes every descriptor.
fn expectEarlyCloseLeaksNothing(backend: io.Kind) !void {
    for ([_]u64{ 1, 64 }) |prefetch| {
        for ([_]bool{ false, true }) |shuffle| {
            var env = try helpers.Env.openFixtures(testing.allocator, &helpers.same_schema, .{ .backend = backend, .prefetch_size = prefetch, .shuffle = shuffle });
            defer env.close();
            const fds_before = try helpers.openFdCount();
            {
                const it = try env.openIter();
                it.close();
            }
            {
                const it = try env.openIter();
                const view = try it.nextBatch(1, false);
                try testing.expectEqual(@as(u64, 1), view.count);
                // The next read is planned (queued, running or complete) beyond the one
                // sample; the next call plans the rest of the window.
                try testing.expect(it.planned > 1 or prefetch == 1);
                _ = try it.nextBatch(1, false);
                try testing.expectEqual(@min(prefetch + 1, env.total()), it.planned);
                it.close();
            }
            {
                const it = try env.openIter();
                _ = try it.nextBatch(5, true);
                const view = try it.nextBatch(2, false);
                try testing.expect(view.count >= 1);
                try testing.expect(it.planned > it.delivered or prefetch == 1);
                it.close();
            }
            try testing.expectEqual(fds_before, try helpers.openFdCount());
        }
    }
}

test "iterator (io_uring): closing early with reads in flight leaks nothing" {
    try expectEarlyCloseLeaksNothing(.io_uring);
}

test "iterator (threads): closing early with reads in flight leaks nothing" {
    try expectEarlyCloseLeaksNothing(.threads);
}

/// A remote cache's shard source over a local fixture: shard `k` is "ready" (not being
/// downloaded) when `k <= ready_upto`, and `open` notes how many samples the consumer had
/// been given when each shard was first opened.
const ReadySource = struct {
    ready_upto: u64,
    delivered: u64 = 0,
    opened_at: [64]?u64 = @splat(null),

    fn source(f: *ReadySource) cache_mod.ShardSource {
        return .{ .context = f, .open = open, .ready = ready };
    }

    fn open(context: *anyopaque, c: *const Cache, shard_id: u64) status.Error!std.posix.fd_t {
        const f: *ReadySource = @ptrCast(@alignCast(context));
        if (f.opened_at[@intCast(shard_id)] == null) f.opened_at[@intCast(shard_id)] = f.delivered;
        return std.posix.openZ(c.shard_paths[@intCast(shard_id)], .{ .ACCMODE = .RDONLY, .CLOEXEC = true }, 0) catch error.Io;
    }

    fn ready(context: *anyopaque, _: *const Cache, shard_id: u64) bool {
        const f: *ReadySource = @ptrCast(@alignCast(context));
        return shard_id <= f.ready_upto;
    }
};

/// Ordered reads of a remote cache whose shards are not ready (each being downloaded):
/// the iterator delivers the records it has in flight before it opens (waits for) the
/// next shard, so each shard opens when every sample before it was delivered (or is in
/// the contiguous batch being filled);
/// with every shard ready the window opens shards ahead. Samples equal expected.json
/// either way.
fn expectReadyShards(backend: io.Kind) !void {
    for ([_]bool{ false, true }) |contiguous| for ([_]u64{ mapped_record_max, 0 }) |map_max| {
        for ([_]u64{ 0, std.math.maxInt(u64) }) |ready_upto| {
            var env = try helpers.Env.openFixtures(testing.allocator, &.{"plain_many_shards"}, .{ .backend = backend, .prefetch_size = 64 });
            defer env.close();
            const c = &env.ds.caches[0];
            const shard_count = c.manifest.shards.len;
            try testing.expect(shard_count > 2 and shard_count <= 64);
            var f: ReadySource = .{ .ready_upto = ready_upto };
            c.source = f.source();
            defer c.source = null;
            const it = try env.openIter();
            defer it.close();
            it.map_max = map_max; // 0: every record through the backend's reads
            var k: u64 = 0;
            while (true) {
                f.delivered = k;
                const view = try it.nextBatch(3, contiguous);
                if (view.count == 0) break;
                for (0..@intCast(view.count)) |i| try env.expectSample(view, i, env.expectedLoc(it, k + i));
                k += view.count;
            }
            try testing.expectEqual(env.total(), k);
            // Samples in the shards before each shard (ordered: sample ids in shard order).
            var before: [64]u64 = @splat(0);
            for (0..@intCast(c.sampleCount())) |sid| {
                for (@intCast(c.row(sid).shard_id + 1)..shard_count) |s| before[s] += 1;
            }
            // (A contiguous batch is full: the one holding a shard's first sample opens it.)
            const batch_start: u64 = if (contiguous) 3 else 1;
            var ahead = false;
            for (f.opened_at[0..shard_count], before[0..shard_count]) |at, want| {
                if (ready_upto == 0) try testing.expectEqual(want - want % batch_start, at.?) else ahead = ahead or at.? + batch_start <= want;
            }
            // (Contiguous batches of mapped records plan nothing ahead.)
            if (ready_upto != 0 and !(contiguous and map_max > 0)) try testing.expect(ahead);
        }
    };
}

test "iterator (io_uring): a shard being downloaded is waited for only after the reads in flight" {
    try expectReadyShards(.io_uring);
}

test "iterator (threads): a shard being downloaded is waited for only after the reads in flight" {
    try expectReadyShards(.threads);
}

const Corruption = enum {
    /// Sample 5's record has a JSON length prefix larger than the record.
    json_len,
    /// Sample 5's index row reaches far past the end of its shard.
    past_shard,
};

/// A corrupt sample fails the iterator only after every sample planned before it was
/// delivered (a failure met mid-batch is deferred to the next call); the iterator then
/// stays finished. Ordered and shuffled, every batch shape, through the backend and from
/// the mappings (a record past its shard's end is never mapped: it is read and fails).
fn expectCorruptRecordDeferred(backend: io.Kind, corruption: Corruption) !void {
    const gpa = testing.allocator;
    const bad: u64 = 5;
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    try helpers.copyFixture(gpa, tmp.dir, "plain_one_shard");
    const rows = try helpers.readIndex(gpa, tmp.dir, "plain_one_shard");
    defer gpa.free(rows);
    switch (corruption) {
        .json_len => {
            const file = try tmp.dir.openFile("plain_one_shard/shards/000000.bin", .{ .mode = .read_write });
            defer file.close();
            var prefix: [8]u8 = undefined;
            std.mem.writeInt(u64, &prefix, 1 << 40, .little);
            try file.pwriteAll(&prefix, rows[bad].offset);
        },
        .past_shard => {
            rows[bad].byte_len = 1 << 30;
            try helpers.writeIndex(gpa, tmp.dir, "plain_one_shard", rows);
        },
    }
    const path = try tmp.dir.realpathAlloc(gpa, "plain_one_shard");
    defer gpa.free(path);

    const shapes = [_]struct { u64, bool }{ .{ 1, false }, .{ 7, false }, .{ 1000, false }, .{ 7, true }, .{ 1000, true } };
    for ([_]u64{ 1, 3, 64 }) |prefetch| {
        for ([_]bool{ false, true }) |shuffle| {
            var env = try helpers.Env.open(gpa, &.{path}, &.{"plain_one_shard"}, .{ .backend = backend, .prefetch_size = prefetch, .shuffle = shuffle, .seed = 3 });
            defer env.close();
            for (shapes) |shape| for ([_]bool{ false, true }) |mapped| for ([_]bool{ false, true }) |stored| {
                const max_count, const contiguous = shape;
                errdefer std.debug.print("{s}: prefetch {d} shuffle {} mapped {} stored {} max_count {d} contiguous {}\n", .{ @tagName(corruption), prefetch, shuffle, mapped, stored, max_count, contiguous });
                const it = try env.openIter();
                defer it.close();
                if (!mapped) it.map_max = 0;
                // Stored metadata (the batch APIs'): ordered contiguous batches take mapped
                // records in runs (`takeAdjacent`), which end before the corrupt one.
                it.batch.stored_metadata = stored;
                // Where the corrupt sample first appears in this window, if it does.
                var first_bad: ?u64 = null;
                for (0..it.schedule.count) |j| {
                    if (env.expectedLoc(it, j).sample_id == bad) {
                        first_bad = j;
                        break;
                    }
                }
                var k: u64 = 0;
                var failed = false;
                while (true) {
                    const view = it.nextBatch(max_count, contiguous) catch |err| {
                        switch (corruption) {
                            .json_len => {
                                try testing.expectEqual(error.InvalidCache, err);
                                try testing.expect(std.mem.startsWith(u8, status.lastMessage(), "invalid binary record: "));
                                try testing.expect(std.mem.endsWith(u8, status.lastMessage(), "/shards/000000.bin"));
                            },
                            .past_shard => {
                                try testing.expectEqual(error.Io, err);
                                try testing.expect(std.mem.startsWith(u8, status.lastMessage(), "I/O error: failed to fill whole buffer: "));
                                try testing.expect(std.mem.endsWith(u8, status.lastMessage(), "plain_one_shard/shards/000000.bin"));
                            },
                        }
                        failed = true;
                        break;
                    };
                    if (view.count == 0) break;
                    for (0..@intCast(view.count)) |i| try env.expectSample(view, i, env.expectedLoc(it, k + i));
                    k += view.count;
                }
                try testing.expectEqual(first_bad != null, failed);
                try testing.expectEqual(first_bad orelse it.schedule.count, k);
                // Finished: no more samples, no second error.
                try testing.expectEqual(@as(u64, 0), (try it.nextBatch(max_count, contiguous)).count);
            };
        }
    }
}

test "iterator (io_uring): a corrupt record fails after the samples before it" {
    try expectCorruptRecordDeferred(.io_uring, .json_len);
    try expectCorruptRecordDeferred(.io_uring, .past_shard);
}

test "iterator (threads): a corrupt record fails after the samples before it" {
    try expectCorruptRecordDeferred(.threads, .json_len);
    try expectCorruptRecordDeferred(.threads, .past_shard);
}

/// The same corrupt record read by a lookup and by an iterator must fail with the same
/// message, however long (a long cache path): slots once kept 256 bytes of it and cut
/// it, possibly inside a UTF-8 sequence.
fn expectLongFailureMessage(backend: io.Kind) !void {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    // A directory name of 100 'é's puts the shard path well past 256 bytes; one leading
    // ASCII byte or none places byte 256 of the message inside an 'é'.
    const tmp_path = try tmp.dir.realpathAlloc(gpa, ".");
    defer gpa.free(tmp_path);
    const before = "I/O error: failed to fill whole buffer: ".len + tmp_path.len + 1;
    try testing.expect(before < 256);
    const ascii: usize = if ((256 - before) % 2 == 1) 0 else 1;
    const dir_name = ("x" ++ "é" ** 100)[1 - ascii ..];
    var parent = try tmp.dir.makeOpenPath(dir_name, .{});
    defer parent.close();
    try helpers.copyFixture(gpa, parent, "plain_one_shard");
    const rows = try helpers.readIndex(gpa, parent, "plain_one_shard");
    defer gpa.free(rows);
    rows[0].byte_len = 1 << 30; // past its shard
    try helpers.writeIndex(gpa, parent, "plain_one_shard", rows);
    const path = try parent.realpathAlloc(gpa, "plain_one_shard");
    defer gpa.free(path);
    var env = try helpers.Env.open(gpa, &.{path}, &.{"plain_one_shard"}, .{ .backend = backend, .prefetch_size = 4 });
    defer env.close();
    const want = try std.fmt.allocPrint(gpa, "I/O error: failed to fill whole buffer: {s}/shards/000000.bin", .{path});
    defer gpa.free(want);
    try testing.expect(want.len > 256);

    const lk = try @import("lookup.zig").Lookup.open(env.ds);
    defer lk.close();
    try testing.expectError(error.Io, lk.get(&.{env.cache_ids[0]}, &.{0}, false));
    try testing.expectEqualStrings(want, status.lastMessage());

    const it = try env.openIter();
    defer it.close();
    try testing.expectError(error.Io, it.nextBatch(1, false));
    const got = status.lastMessage();
    try testing.expectEqualStrings(want, got);
}

test "iterator (io_uring): a long failure message reads as the lookup's" {
    try expectLongFailureMessage(.io_uring);
}

test "iterator (threads): a long failure message reads as the lookup's" {
    try expectLongFailureMessage(.threads);
}

test "iterator: locateStep locates as ds.locate does, across caches, wraps and blocks" {
    var env = try helpers.Env.openFixtures(testing.allocator, &helpers.same_schema, .{});
    defer env.close();
    const total = env.ds.total();
    // Whole passes, a window wrapping past the last sample, and blocks of a range.
    const schedules = [_]Schedule{
        .{ .start = 0, .count = 2 * total + 3 },
        .{ .start = total - 7, .count = 40 },
        .{ .start = 700, .count = 60, .block_len = 2, .block_stride = 6 },
        .{ .start = 3, .count = 50, .block_len = 5, .block_stride = 5 },
    };
    for (schedules) |schedule| {
        const it = try Iter.openRange(env.ds, schedule);
        defer it.close();
        var locs: [mapped_step]Loc = undefined;
        // Steps of every length, from every offset.
        for (1..mapped_step + 1) |len| {
            var k: u64 = 0;
            while (k < schedule.count) : (k += len) {
                const n: usize = @intCast(@min(len, schedule.count - k));
                it.locateStep(k, locs[0..n]);
                for (locs[0..n], k..) |loc, i| try testing.expectEqual(env.ds.locate(it.table, schedule.position(i)), loc);
            }
        }
    }
}
