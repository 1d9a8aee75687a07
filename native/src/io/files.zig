//! The descriptor cache of one reader: shard files opened lazily and kept in a small
//! two-way set-associative table, so a reader holds at most `open_files_max` cached
//! descriptors however many caches and shards a dataset has (10,000 caches must not
//! exhaust RLIMIT_NOFILE), plus at most `owned_max` of reads whose two entries are busy.
//! And `Maps`: a reader's read-only mappings of shard windows, within a byte budget, for
//! small reads of page-cache-resident records.
//!
//! And `Hints`: kernel read-ahead advice (`POSIX_FADV_WILLNEED`) for the byte ranges an
//! ordered iterator reads next, within its byte budget.
//!
//! Invariants:
//! - An entry is pinned while a read or a hint job on it may be in flight and is never
//!   closed then: a read whose two entries are pinned by other files gets an uncached
//!   descriptor of its own ("owned"), closed on release.
//! - A reader that keeps reads in flight asks `full` before planning one: owned
//!   descriptors beyond `owned_max` wait for reads to complete instead of being opened.
//! - Only the owning thread touches the table, so pins need no atomics.

const std = @import("std");
const posix = std.posix;
const status = @import("../base/status.zig");
const runtime = @import("../base/runtime.zig");

/// Descriptors a reader keeps open at most.
pub const open_files_max = 64;
/// Uncached descriptors of reads in flight a reader plans at most (see `Files.full`).
pub const owned_max = 64;

/// Identifies a file: a cache's position in its dataset and a shard number.
pub const Key = struct {
    cache: u32,
    shard_id: u64,

    /// The two entries the key may occupy (they may coincide).
    fn slots(k: Key) [2]usize {
        const h = (@as(u64, k.cache) *% 0x9E3779B97F4A7C15 +% k.shard_id) *% 0xBF58476D1CE4E5B9;
        return .{ @intCast(h >> 58), @intCast((h >> 52) % open_files_max) };
    }
};

pub const Files = struct {
    entries: [open_files_max]Entry = [_]Entry{.{}} ** open_files_max,
    /// Uncached descriptors handed out and not released.
    owned: u32 = 0,

    const Entry = struct {
        key: Key = .{ .cache = 0, .shard_id = 0 },
        fd: posix.fd_t = -1,
        pins: u32 = 0,
    };

    /// A descriptor in use by one read: cached (`entry` set) or owned.
    pub const Handle = struct {
        fd: posix.fd_t,
        entry: ?usize,
    };

    /// The entry caching `key`, if any.
    fn find(fs: *const Files, key: Key) ?usize {
        for (key.slots()) |h| {
            const e = &fs.entries[h];
            if (e.fd >= 0 and std.meta.eql(e.key, key)) return h;
        }
        return null;
    }

    /// The entry `key` would replace: an empty one, else an unpinned one, else null.
    fn victim(fs: *const Files, key: Key) ?usize {
        const hs = key.slots();
        for (hs) |h| if (fs.entries[h].fd < 0) return h;
        for (hs) |h| if (fs.entries[h].pins == 0) return h;
        return null;
    }

    /// The descriptor of `key`, opened with `opener.open(key)` when it is not cached.
    /// Pinned until `release`.
    pub fn acquire(fs: *Files, key: Key, opener: anytype) status.Error!Handle {
        if (fs.find(key)) |h| {
            fs.entries[h].pins += 1;
            return .{ .fd = fs.entries[h].fd, .entry = h };
        }
        const fd = try opener.open(key);
        const h = fs.victim(key) orelse {
            fs.owned += 1;
            return .{ .fd = fd, .entry = null };
        };
        const entry = &fs.entries[h];
        if (entry.fd >= 0) posix.close(entry.fd);
        entry.* = .{ .key = key, .fd = fd, .pins = 1 };
        return .{ .fd = fd, .entry = h };
    }

    /// `acquire`, or null when that would open an owned descriptor beyond `owned_max`
    /// (`full`): for paths that pin many descriptors at once and can stop early.
    pub fn acquireWithin(fs: *Files, key: Key, opener: anytype) status.Error!?Handle {
        if (fs.full(key)) return null;
        return try fs.acquire(key, opener);
    }

    /// Whether the descriptor of `key` is cached (`acquire` would open nothing).
    pub fn has(fs: *const Files, key: Key) bool {
        return fs.find(key) != null;
    }

    /// Whether `acquire(key)` would open an owned descriptor beyond `owned_max`: a reader
    /// with reads in flight waits for them instead (each holds a pin or an owned
    /// descriptor until it completes, so waiting always ends).
    pub fn full(fs: *const Files, key: Key) bool {
        return fs.owned >= owned_max and fs.find(key) == null and fs.victim(key) == null;
    }

    pub fn release(fs: *Files, handle: Handle) void {
        if (handle.entry) |h| {
            std.debug.assert(fs.entries[h].pins > 0);
            fs.entries[h].pins -= 1;
        } else {
            std.debug.assert(fs.owned > 0);
            fs.owned -= 1;
            posix.close(handle.fd);
        }
    }

    /// Precondition: every handle released.
    pub fn deinit(fs: *Files) void {
        std.debug.assert(fs.owned == 0);
        for (&fs.entries) |*e| {
            std.debug.assert(e.pins == 0);
            if (e.fd >= 0) posix.close(e.fd);
            e.fd = -1;
        }
    }
};

/// Kernel read-ahead hints for byte ranges a reader will read soon
/// (`posix_fadvise(POSIX_FADV_WILLNEED)`): the kernel starts reading them into the page
/// cache and the call returns without waiting for the disk, so the disk works on them
/// while the reader's own reads are still in flight. Cold ordered reads then find their
/// bytes read, or being read, well ahead, instead of a read-ahead window that the
/// kernel sizes from a few concurrent reads.
///
/// The caller walks its plan in order and `add`s each upcoming record's range, tagged
/// with the plan index just past the record; adjacent ranges of one file are advised in
/// one call of up to `chunk_max` bytes. Advised chunks count until planning reaches their
/// end (`reached`), and `room` says whether more may be advised within a byte bound, so
/// what is advised and not yet planned stays under the caller's budget.
///
/// With a `pool`, each call runs as a job on a pool worker (allocating the page-cache
/// pages of a range costs the caller's thread ~0.15 ms per MiB otherwise); each chunk's
/// job pins its file's descriptor until the owner sees it done (`reached`). A job whose
/// range ends in a page already in the page cache advises nothing and says so
/// (`resident_seen`), so warm data costs a probe, not a walk of its pages. Only the
/// owning thread calls these functions. `deinit` takes back or waits for every job.
pub const Hints = struct {
    /// Advised chunks planning has not passed yet, oldest first: a ring, whose entry `i`
    /// is advised by `jobs[i]`.
    chunks: [chunks_max]Chunk = undefined,
    jobs: [chunks_max]Job = [_]Job{.{}} ** chunks_max,
    head: usize = 0,
    count: usize = 0,
    /// Bytes of `chunks`.
    bytes: u64 = 0,
    /// The range being gathered, not advised yet.
    gathering: ?Chunk = null,
    /// Plan indexes below this were walked (added or skipped).
    cursor: u64 = 0,
    /// Bytes advised at most per call.
    chunk_max: u64 = hint_chunk_max,
    /// Where advice runs; null: on the calling thread.
    pool: ?*runtime.Pool = null,
    /// Calls made and bytes advised so far (tests check what was advised).
    calls: u64 = 0,
    advised_bytes: u64 = 0,
    /// The last job seen done found its range in the page cache (`Job.resident`).
    resident_seen: bool = false,

    pub const chunks_max = 16;

    pub const Chunk = struct {
        key: Key,
        offset: u64,
        len: u64,
        /// The plan index just past the chunk's last record.
        end: u64,
    };

    /// One chunk's advice on a pool worker. `task`: idle, queued (the worker may run
    /// it), done (ran; `handle` still pinned until `reap`).
    const Job = struct {
        handle: ?Files.Handle = null,
        offset: u64 = 0,
        len: u64 = 0,
        /// Set by `run`: the range's last byte was in the page cache already, so it was
        /// not advised (data read before: the records after it likely are too).
        resident: bool = false,
        task: runtime.Task = .init(run),

        fn run(job: *runtime.Job) void {
            const task: *runtime.Task = @fieldParentPtr("job", job);
            const j: *Job = @fieldParentPtr("task", task);
            var last: [1]u8 = undefined;
            j.resident = readResident(j.handle.?.fd, &last, j.offset + j.len - 1);
            if (!j.resident) willNeed(j.handle.?.fd, j.offset, j.len);
            task.finish();
        }
    };

    /// Forgets the chunks whose records are all planned (`end <= planned`), and unpins
    /// the descriptors of jobs that ran.
    pub fn reached(h: *Hints, files: *Files, planned: u64) void {
        while (h.count > 0 and h.chunks[h.head].end <= planned) {
            h.bytes -= h.chunks[h.head].len;
            h.head = (h.head + 1) % chunks_max;
            h.count -= 1;
        }
        for (&h.jobs) |*j| {
            if (j.task.is(runtime.Task.done)) h.finish(files, j);
        }
    }

    fn finish(h: *Hints, files: *Files, j: *Job) void {
        h.resident_seen = j.resident;
        if (j.handle) |handle| files.release(handle);
        j.handle = null;
        j.task.reset();
    }

    /// Whether a record of `len` bytes may be added within `budget` bytes advised and
    /// not yet planned: room for two more chunks (the one gathered and a new one) whose
    /// jobs are free.
    pub fn room(h: *const Hints, budget: u64, len: u64) bool {
        const gathering = if (h.gathering) |g| g.len else 0;
        if (h.count + 2 > chunks_max or h.bytes + gathering +| len > budget) return false;
        for (0..2) |k| {
            if (!h.jobs[(h.head + h.count + k) % chunks_max].task.is(runtime.Task.idle)) return false;
        }
        return true;
    }

    /// Adds `len` (> 0) bytes at `offset` of `key`, whose record ends before plan index
    /// `end`: joined to the range being gathered when it follows it in the same file and
    /// the result stays within `chunk_max`, else that range is advised first.
    /// Precondition: `room` said yes.
    pub fn add(h: *Hints, files: *Files, opener: anytype, key: Key, offset: u64, len: u64, end: u64) void {
        if (h.gathering) |*g| {
            if (std.meta.eql(g.key, key) and g.offset + g.len == offset and g.len + len <= h.chunk_max) {
                g.len += len;
                g.end = end;
                return;
            }
            h.flush(files, opener);
        }
        h.gathering = .{ .key = key, .offset = offset, .len = len, .end = end };
    }

    /// Advises the range being gathered, if any.
    pub fn flush(h: *Hints, files: *Files, opener: anytype) void {
        const g = h.gathering orelse return;
        h.gathering = null;
        std.debug.assert(h.count < chunks_max);
        const at = (h.head + h.count) % chunks_max;
        const j = &h.jobs[at];
        std.debug.assert(j.task.is(runtime.Task.idle));
        h.chunks[at] = g;
        h.count += 1;
        h.bytes += g.len;
        const handle = files.acquire(g.key, opener) catch return;
        h.calls += 1;
        h.advised_bytes += g.len;
        if (h.pool) |pool| {
            j.* = .{ .handle = handle, .offset = g.offset, .len = g.len };
            j.task.submit(pool);
        } else {
            willNeed(handle.fd, g.offset, g.len);
            files.release(handle);
        }
    }

    /// Takes back the jobs no worker started, waits for the others, and unpins every
    /// descriptor. The hints may be used again afterwards (nothing is advised).
    pub fn deinit(h: *Hints, files: *Files) void {
        for (&h.jobs) |*j| {
            if (h.pool) |pool| _ = j.task.takeBack(pool);
            if (j.task.is(runtime.Task.done)) h.finish(files, j);
        }
        h.head = 0;
        h.count = 0;
        h.bytes = 0;
        h.gathering = null;
    }
};

/// A hinted range joins the next one up to this many bytes (one `fadvise` call).
pub const hint_chunk_max = 4 << 20;

/// Asks the kernel to read `[offset, offset + len)` of `fd` into the page cache in the
/// background (`POSIX_FADV_WILLNEED`). A hint: failures are ignored.
pub fn willNeed(fd: posix.fd_t, offset: u64, len: u64) void {
    if (offset > std.math.maxInt(i64) or len > std.math.maxInt(i64)) return;
    _ = std.os.linux.fadvise(fd, @intCast(offset), @intCast(len), std.os.linux.POSIX_FADV.WILLNEED);
}

/// Mapped windows: a shard is mapped in windows of `window_bytes` (each window also maps
/// `window_overlap` bytes of the next, so a record shorter than that which starts in a
/// window lies inside its mapping), at most `Maps.budget` bytes at a time per `Maps`
/// (`mapped_bytes_max` or `random_mapped_bytes_max`).
pub const window_bytes = 2 << 20;
pub const window_overlap = 64 << 10;
/// The byte budget of an ordered iterator's `Maps`: the pages of its mappings count in
/// the process's resident set once touched, so this bounds what mapped reads add to it.
/// Ordered reads finish with a window long before it is unmapped, so more would not
/// serve more records from mappings.
pub const mapped_bytes_max = 48 << 20;
/// Windows mapped at most (a shard smaller than a window is one small window; the byte
/// budget bounds large ones).
pub const windows_max = 64;
/// The byte budget of a random reader's `Maps` (a lookup handle, a shuffled iterator; see
/// `Maps.budget`): every window, 132 MiB.
pub const random_mapped_bytes_max = windows_max * (window_bytes + window_overlap);
/// A window is unmapped to make room for another only when it was last used at least
/// this many accesses ago: ordered reads finish with a window long before (a window holds
/// thousands of small records), while random reads touch every window again soon, and
/// remapping windows they still use would cost a mapping and page faults per few records
/// (those reads go through the I/O backend instead).
pub const evict_age_min = 1024;

/// One reader's read-only shared mappings of shard windows (see `window_bytes`), made on
/// first use, each with a snapshot of which of its pages were in the page cache then
/// (`mincore`). A small read of resident pages is served from a mapping (no system call,
/// no copy into a read buffer); anything else goes through the I/O backend, so cold data
/// is still read with many requests in flight instead of one page fault at a time on the
/// consumer thread.
///
/// A shard is mapped only when its file is at least as long as its manifest length: cache
/// files are never changed once published, so a mapping stays valid. A shard truncated
/// after it was mapped is a corrupt cache and touching its lost pages raises SIGBUS, the
/// risk the memory-mapped index.bin already carries.
///
/// Memory: mapped pages count in the process's resident set (shared page-cache pages, not
/// anonymous memory) once touched, until their window is unmapped; at most
/// `budget` bytes are mapped, so that is what a reader's mapped reads can add.
/// When the budget is full a window is unmapped only if it is not pinned and old enough
/// (`evict_age_min`); otherwise the read is not served from a mapping.
///
/// Pins: the caller stamps every access with a number that never decreases (`now`; an
/// iterator uses the record's plan index) and says from which stamp on windows may still
/// be referenced (`pinned_from`); a window whose last stamp is at or past it is never
/// unmapped, so bytes handed out stay valid until the caller moves `pinned_from` past
/// them.
pub const Maps = struct {
    /// Per shard: whether it can be mapped (its file is long enough and mmap works).
    shards: std.AutoHashMapUnmanaged(Key, bool) = .empty,
    windows: [windows_max]Window = undefined,
    count: usize = 0,
    mapped_bytes: u64 = 0,
    /// Bytes mapped at most: `mapped_bytes_max` for ordered iterators; random readers
    /// (lookups, shuffled iterators), whose reads would otherwise pay a system call per
    /// record once the windows they keep revisiting fill the budget, map up to
    /// `windows_max` whole windows (`random_mapped_bytes_max`).
    budget: u64 = mapped_bytes_max,
    /// The window the last hit was in (most runs stay in one window).
    last: usize = 0,
    /// Windows mapped and unmapped so far (tests check the budget's behaviour).
    mapped_total: u64 = 0,
    /// Whether the last `get` returned null only because the budget was full of windows
    /// that may not be unmapped (its shard can be mapped).
    over_budget: bool = false,
    /// `madvise(MADV_RANDOM)` on new windows (lookups: a fault reads one page, as a
    /// pread of a small record would).
    random: bool = false,
    /// Where each window is in `windows`, by (key, number): open addressing with linear
    /// probing, `index_empty` for none, rebuilt whenever a window is added, removed or
    /// moved (`reindex`; rare next to lookups). Random reads over many windows find
    /// theirs, or learn it is not mapped, in a probe or two instead of a scan of them all.
    index: [index_len]u8 = [_]u8{index_empty} ** index_len,
    /// No window may be unmapped before an access stamped at least this: the oldest
    /// window was last used at `evict_from - evict_age_min` and stamps never decrease
    /// (see `mapWindow`). Random reads past the budget are refused without a scan.
    evict_from: u64 = 0,

    const index_len = 2 * windows_max;
    const index_empty: u8 = std.math.maxInt(u8);
    comptime {
        std.debug.assert(std.math.isPowerOfTwo(index_len) and windows_max < index_empty);
    }

    pub const Window = struct {
        key: Key,
        /// The window's number in its shard: it maps from `number * window_bytes`.
        number: u64,
        bytes: []align(std.heap.page_size_min) const u8,
        /// One byte per page (mincore's vector): bit 0 set when the page was resident.
        resident: []u8,
        stamp: u64,

        /// Whether every page of `[offset, offset + len)` (window-relative, inside the
        /// mapping, len > 0) was resident when the window was mapped.
        pub fn residentRange(w: *const Window, offset: u64, len: u64) bool {
            std.debug.assert(len > 0 and offset + len <= w.bytes.len);
            const shift: u6 = @intCast(std.math.log2_int(usize, std.heap.pageSize()));
            const first: usize = @intCast(offset >> shift);
            const last: usize = @intCast((offset + len - 1) >> shift);
            for (w.resident[first .. last + 1]) |v| {
                if (v & 1 == 0) return false;
            }
            return true;
        }
    };

    pub const Access = struct {
        /// This access's stamp (never below an earlier one).
        now: u64,
        /// Windows last used at or after this stamp may still be referenced.
        pinned_from: u64,
        /// Serve only pages that were resident when their window was mapped.
        resident_only: bool,
    };

    /// The `len` bytes at `offset` of shard `key` (`shard_len` bytes long in its
    /// manifest) from a mapping, or null: the range is not inside the manifest length,
    /// `len` is 0 or over `window_overlap`, the shard cannot be mapped, the budget is full
    /// of windows that may not be unmapped, or (`resident_only`) a page was not resident.
    pub fn get(m: *Maps, gpa: std.mem.Allocator, key: Key, shard_len: u64, offset: u64, len: u64, files: *Files, opener: anytype, access: Access) ?[]const u8 {
        m.over_budget = false;
        if (len == 0 or len > window_overlap or offset > shard_len or len > shard_len - offset) return null;
        const number = offset / window_bytes;
        const w = m.find(key, number) orelse (m.mapWindow(gpa, key, shard_len, number, files, opener, access) orelse return null);
        const at = offset - number * window_bytes;
        // A window mapped when the shard was known shorter (never for a published cache,
        // whose manifest does not change) does not serve the range.
        if (at + len > w.bytes.len) return null;
        if (access.resident_only and !w.residentRange(at, len)) return null;
        w.stamp = @max(w.stamp, access.now);
        return w.bytes[@intCast(at)..][0..@intCast(len)];
    }

    fn find(m: *Maps, key: Key, number: u64) ?*Window {
        if (m.count > 0) {
            const w = &m.windows[m.last];
            if (w.number == number and std.meta.eql(w.key, key)) return w;
        }
        var h = indexSlot(key, number);
        while (m.index[h] != index_empty) : (h = (h + 1) % index_len) {
            const i = m.index[h];
            const w = &m.windows[i];
            if (w.number == number and std.meta.eql(w.key, key)) {
                m.last = i;
                return w;
            }
        }
        return null;
    }

    fn indexSlot(key: Key, number: u64) usize {
        const mixed = (key.shard_id *% 0x9E3779B97F4A7C15 +% number) *% 0xC2B2AE3D27D4EB4F +% key.cache;
        const shift: u6 = comptime @intCast(64 - @as(u7, std.math.log2_int(usize, index_len)));
        return @intCast((mixed *% 0x9E3779B97F4A7C15) >> shift);
    }

    /// Rebuilds `index` from `windows[0..count]`.
    fn reindex(m: *Maps) void {
        @memset(&m.index, index_empty);
        for (m.windows[0..m.count], 0..) |*w, i| {
            var h = indexSlot(w.key, w.number);
            while (m.index[h] != index_empty) h = (h + 1) % index_len;
            m.index[h] = @intCast(i);
        }
    }

    fn mapWindow(m: *Maps, gpa: std.mem.Allocator, key: Key, shard_len: u64, number: u64, files: *Files, opener: anytype, access: Access) ?*Window {
        const start = number * window_bytes;
        const len = @min(shard_len - start, window_bytes + window_overlap);
        // Room: a free place, or the least recently used window if it may go.
        var slot = m.count;
        if (m.count == windows_max or m.mapped_bytes + len > m.budget) {
            if (access.now < m.evict_from) {
                // As below: the oldest window is too recent to go.
                if (!m.mappable(gpa, key, shard_len, files, opener)) return null;
                m.over_budget = true;
                return null;
            }
            var oldest: usize = 0;
            for (m.windows[0..m.count], 0..) |*w, i| {
                if (w.stamp < m.windows[oldest].stamp) oldest = i;
            }
            const w = &m.windows[oldest];
            if (!m.mappable(gpa, key, shard_len, files, opener)) return null;
            if (w.stamp >= access.pinned_from or access.now -| w.stamp < evict_age_min or
                (m.count < windows_max and m.mapped_bytes - w.bytes.len + len > m.budget))
            {
                // Every window was last used at `w.stamp` or later, and later stamps are
                // never lower: none may go for an age below `evict_age_min` until then.
                m.evict_from = w.stamp +| evict_age_min;
                m.over_budget = true;
                return null;
            }
            m.unmap(gpa, w);
            m.mapped_bytes -= w.bytes.len;
            slot = oldest;
        } else if (!m.mappable(gpa, key, shard_len, files, opener)) return null;
        const w = mapRange(gpa, key, start, @intCast(len), files, opener, m.random) orelse {
            if (slot != m.count) {
                // The evicted window's place is empty now: fill it with the last one.
                m.count -= 1;
                m.windows[slot] = m.windows[m.count];
                m.reindex();
            }
            m.last = 0;
            return null;
        };
        m.windows[slot] = .{ .key = key, .number = number, .bytes = w.bytes, .resident = w.resident, .stamp = access.now };
        if (slot == m.count) m.count += 1;
        m.reindex();
        m.mapped_bytes += len;
        m.mapped_total += 1;
        m.last = slot;
        return &m.windows[slot];
    }

    /// Whether shard `key` can be mapped: its file is at least `shard_len` bytes (checked
    /// once per shard).
    fn mappable(m: *Maps, gpa: std.mem.Allocator, key: Key, shard_len: u64, files: *Files, opener: anytype) bool {
        const entry = m.shards.getOrPut(gpa, key) catch return false;
        if (entry.found_existing) return entry.value_ptr.*;
        entry.value_ptr.* = blk: {
            if (shard_len == 0 or shard_len > std.math.maxInt(usize)) break :blk false;
            const handle = files.acquire(key, opener) catch break :blk false;
            defer files.release(handle);
            const st = posix.fstat(handle.fd) catch break :blk false;
            break :blk st.size >= 0 and @as(u64, @intCast(st.size)) >= shard_len;
        };
        return entry.value_ptr.*;
    }

    fn mapRange(gpa: std.mem.Allocator, key: Key, start: u64, len: usize, files: *Files, opener: anytype, random: bool) ?struct { bytes: []align(std.heap.page_size_min) const u8, resident: []u8 } {
        const handle = files.acquire(key, opener) catch return null;
        defer files.release(handle);
        const page = std.heap.pageSize();
        const pages = std.math.divCeil(usize, len, page) catch unreachable;
        const resident = gpa.alloc(u8, pages) catch return null;
        const bytes = posix.mmap(null, len, posix.PROT.READ, .{ .TYPE = .SHARED }, handle.fd, start) catch {
            gpa.free(resident);
            return null;
        };
        if (random) posix.madvise(bytes.ptr, bytes.len, posix.MADV.RANDOM) catch {};
        // A window whose pages are all cached (ordered reads of warm data: nearly every
        // one) is known so from one `cachestat`, several times cheaper than `mincore`'s
        // lookup of each page; otherwise `mincore` says which pages are. Refused (for
        // example for a file this user could not write: the kernel then reports only
        // pages mapped here): nothing counts as resident.
        if (allCached(handle.fd, start, len, pages)) {
            @memset(resident, 1);
        } else {
            posix.mincore(@constCast(bytes.ptr), len, resident.ptr) catch @memset(resident, 0);
        }
        return .{ .bytes = bytes, .resident = resident };
    }

    /// Whether all `pages` pages of `[start, start + len)` of `fd` are in the page cache,
    /// by `cachestat(2)` (Linux 6.5); false when it is not available or fails.
    fn allCached(fd: posix.fd_t, start: u64, len: usize, pages: usize) bool {
        if (comptime @import("builtin").os.tag != .linux) return false;
        const linux = std.os.linux;
        const range = extern struct { off: u64, len: u64 }{ .off = start, .len = len };
        var stat: extern struct { cache: u64, dirty: u64, writeback: u64, evicted: u64, recently_evicted: u64 } = .{ .cache = 0, .dirty = 0, .writeback = 0, .evicted = 0, .recently_evicted = 0 };
        const rc = linux.syscall4(.cachestat, @bitCast(@as(isize, fd)), @intFromPtr(&range), @intFromPtr(&stat), 0);
        if (linux.E.init(rc) != .SUCCESS) return false;
        return stat.cache == pages;
    }

    fn unmap(m: *Maps, gpa: std.mem.Allocator, w: *Window) void {
        _ = m;
        posix.munmap(w.bytes);
        gpa.free(w.resident);
    }

    pub fn deinit(m: *Maps, gpa: std.mem.Allocator) void {
        for (m.windows[0..m.count]) |*w| m.unmap(gpa, w);
        m.shards.deinit(gpa);
        m.* = .{};
    }
};

/// The byte budget of a dataset's `ShardMaps`: whole shards mapped at most, so at most
/// what its staged batches' mappings add to the process's resident set.
pub const shard_maps_bytes_max = 256 << 20;
/// Shards a dataset's `ShardMaps` maps at most: each mapping is one of the process's
/// memory map areas (`vm.max_map_count`, 65,530 by default), and a dataset of many
/// small caches must not use them up.
pub const shard_maps_max = 1024;

/// A dataset's read-only shared mappings of whole shards, used by its pool jobs (staged
/// batches, `read/adjacent.zig` `Fill`) to copy resident payloads straight out of the
/// page cache: a shard is mapped on first use and stays mapped until the dataset is
/// closed, so every later epoch copies from pages already mapped (no system call, no
/// page-cache lookup, no page fault; mappings made and dropped per iterator cost as much
/// as the reads they replace, see benchmarks/README.md round 20).
///
/// A shard is mapped only when its file is at least its manifest length (as `Maps`);
/// touching a page of a shard truncated after that raises SIGBUS, the risk `Maps` and
/// the mapped index.bin carry (a job first checks that its runs are in the page cache,
/// which pages past a truncated end are not). At most `budget` bytes are mapped: a shard
/// asked for when it does not fit, or past `shard_maps_max` shards, is never mapped (its
/// runs are read with `pread`), so nothing is ever unmapped while a job may copy from
/// it. Thread-safe: the table is used under `mutex` (one hash lookup per run planned); a
/// mapping, once made, never changes.
pub const ShardMaps = struct {
    mutex: std.Thread.Mutex = .{},
    budget: u64 = shard_maps_bytes_max,
    mapped_bytes: u64 = 0,
    mapped_count: usize = 0,
    /// Per shard asked for: its mapping (its manifest length), or empty when it is not
    /// mapped (file too short, mmap failed, over the budget or the count).
    shards: std.AutoHashMapUnmanaged(Key, []align(std.heap.page_size_min) const u8) = .empty,

    /// The mapping of shard `key` (`shard_len` bytes long in its manifest, open as `fd`),
    /// made on the first call for it; null when it is not mapped. Valid until `deinit`.
    pub fn get(m: *ShardMaps, gpa: std.mem.Allocator, key: Key, shard_len: u64, fd: posix.fd_t) ?[]const u8 {
        m.mutex.lock();
        defer m.mutex.unlock();
        const entry = m.shards.getOrPut(gpa, key) catch return null;
        if (!entry.found_existing) entry.value_ptr.* = m.map(shard_len, fd);
        const bytes = entry.value_ptr.*;
        return if (bytes.len == 0) null else bytes;
    }

    fn map(m: *ShardMaps, shard_len: u64, fd: posix.fd_t) []align(std.heap.page_size_min) const u8 {
        if (shard_len == 0 or shard_len > std.math.maxInt(usize) or shard_len > m.budget - m.mapped_bytes or m.mapped_count == shard_maps_max) return &.{};
        const st = posix.fstat(fd) catch return &.{};
        if (st.size < 0 or @as(u64, @intCast(st.size)) < shard_len) return &.{};
        const bytes = posix.mmap(null, @intCast(shard_len), posix.PROT.READ, .{ .TYPE = .SHARED }, fd, 0) catch return &.{};
        m.mapped_bytes += shard_len;
        m.mapped_count += 1;
        return bytes;
    }

    pub fn deinit(m: *ShardMaps, gpa: std.mem.Allocator) void {
        var it = m.shards.valueIterator();
        while (it.next()) |bytes| if (bytes.len > 0) posix.munmap(bytes.*);
        m.shards.deinit(gpa);
        m.* = .{};
    }
};

/// Whether every page of `[offset, offset + len)` of `fd`, mapped whole at `bytes`, is
/// in the page cache now (`rangeCached`, else `mincore` of the mapping: before Linux
/// 6.5, or for a file this user could not write, whose unmapped pages `mincore` does not
/// report, which then counts as not resident). Pre: the range is inside `bytes`.
pub fn mappedResident(fd: posix.fd_t, bytes: []const u8, offset: u64, len: u64) bool {
    std.debug.assert(len > 0 and offset + len <= bytes.len);
    if (rangeCached(fd, offset, len)) return true;
    const page = std.heap.pageSize();
    var at: usize = @intCast(offset / page * page);
    const end: usize = @intCast(offset + len);
    var vec: [256]u8 = undefined;
    while (at < end) {
        const n = @min(end - at, vec.len * page);
        posix.mincore(@alignCast(@constCast(bytes.ptr + at)), n, &vec) catch return false;
        for (vec[0 .. (n + page - 1) / page]) |v| if (v & 1 == 0) return false;
        at += n;
    }
    return true;
}

/// The tests' opener: every key opens the file "a" of `dir`, counting the opens.
const TestOpener = struct {
    dir: std.fs.Dir,
    opened: u32 = 0,
    fn open(o: *@This(), key: Key) status.Error!posix.fd_t {
        _ = key;
        o.opened += 1;
        const f = o.dir.openFile("a", .{}) catch return error.Io;
        return f.handle;
    }
};

fn sameEntries(a: Key, b: Key) bool {
    const x = a.slots();
    const y = b.slots();
    return (x[0] == y[0] and x[1] == y[1]) or (x[0] == y[1] and x[1] == y[0]);
}

test "descriptors are cached, pinned entries are never closed under a read" {
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    try tmp.dir.writeFile(.{ .sub_path = "a", .data = "a" });
    var opener: TestOpener = .{ .dir = tmp.dir };
    var fs: Files = .{};
    defer fs.deinit();
    // A key with two distinct entries, and two more keys of the same two entries.
    var k1: Key = .{ .cache = 0, .shard_id = 1 };
    while (k1.slots()[0] == k1.slots()[1]) k1.shard_id += 1;
    const a = try fs.acquire(k1, &opener);
    const b = try fs.acquire(k1, &opener);
    try std.testing.expectEqual(a.fd, b.fd);
    try std.testing.expectEqual(@as(u32, 1), opener.opened);
    var others: [2]Key = undefined;
    var id: u64 = k1.shard_id;
    for (&others) |*o| {
        id += 1;
        while (!sameEntries(.{ .cache = 0, .shard_id = id }, k1)) id += 1;
        o.* = .{ .cache = 0, .shard_id = id };
    }
    // The first takes the second entry; with both pinned, the next gets a private one.
    const c = try fs.acquire(others[0], &opener);
    try std.testing.expect(c.entry != null and c.entry != a.entry);
    const d = try fs.acquire(others[1], &opener);
    try std.testing.expect(d.entry == null);
    try std.testing.expectEqual(@as(u32, 1), fs.owned);
    fs.release(d);
    fs.release(c);
    fs.release(a);
    fs.release(b);
    try std.testing.expectEqual(@as(u32, 0), fs.owned);
    // Unpinned: an entry is reused for the other key.
    const e = try fs.acquire(others[1], &opener);
    try std.testing.expect(e.entry != null);
    fs.release(e);
}

test "full: owned descriptors stop at owned_max, and only for keys that would need one" {
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    try tmp.dir.writeFile(.{ .sub_path = "a", .data = "a" });
    var opener: TestOpener = .{ .dir = tmp.dir };
    var fs: Files = .{};
    defer fs.deinit();
    var handles: std.ArrayList(Files.Handle) = .empty;
    defer handles.deinit(std.testing.allocator);
    // Distinct keys, each pinned, as reads in flight hold them.
    var id: u64 = 0;
    while (fs.owned < owned_max) : (id += 1) {
        const key: Key = .{ .cache = 1, .shard_id = id };
        try std.testing.expect(!fs.full(key));
        try handles.append(std.testing.allocator, try fs.acquire(key, &opener));
    }
    // Every entry is pinned now: a new key is full, a cached one is not.
    try std.testing.expect(fs.full(.{ .cache = 1, .shard_id = id }));
    try std.testing.expect(!fs.full(.{ .cache = 1, .shard_id = 0 }));
    try std.testing.expectEqual(@as(usize, open_files_max + owned_max), handles.items.len);
    // One read completes: room again.
    fs.release(handles.pop().?);
    try std.testing.expect(!fs.full(.{ .cache = 1, .shard_id = id }));
    for (handles.items) |h| fs.release(h);
}

test "windows are mapped on use, within the byte budget, and unmapped only when old and unpinned" {
    const gpa = std.testing.allocator;
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    // One shard of more windows than the budget holds.
    const windows = mapped_bytes_max / window_bytes + 4;
    const len: u64 = windows * window_bytes + 100;
    const data = try gpa.alloc(u8, @intCast(len));
    defer gpa.free(data);
    for (data, 0..) |*b, i| b.* = @truncate(i *% 7 +% i / 251);
    try tmp.dir.writeFile(.{ .sub_path = "a", .data = data });
    var opener: TestOpener = .{ .dir = tmp.dir };
    var fs: Files = .{};
    defer fs.deinit();
    var maps: Maps = .{};
    defer maps.deinit(gpa);
    const k: Key = .{ .cache = 0, .shard_id = 0 };
    var now: u64 = 0;
    // Bytes are the file's, also across a window boundary (the overlap).
    const across = window_bytes - 10;
    const got = maps.get(gpa, k, len, across, 500, &fs, &opener, .{ .now = now, .pinned_from = 0, .resident_only = true }).?;
    try std.testing.expectEqualSlices(u8, data[across..][0..500], got);
    try std.testing.expectEqual(@as(u64, 1), maps.mapped_total);
    // The same window again: no new mapping.
    now += 1;
    _ = maps.get(gpa, k, len, 3, 10, &fs, &opener, .{ .now = now, .pinned_from = 0, .resident_only = true }).?;
    try std.testing.expectEqual(@as(u64, 1), maps.mapped_total);
    // Ranges outside the manifest length, empty or longer than the overlap are refused.
    try std.testing.expect(maps.get(gpa, k, len, len - 5, 6, &fs, &opener, .{ .now = now, .pinned_from = 0, .resident_only = true }) == null);
    try std.testing.expect(maps.get(gpa, k, len, 0, 0, &fs, &opener, .{ .now = now, .pinned_from = 0, .resident_only = true }) == null);
    try std.testing.expect(maps.get(gpa, k, len, 0, window_overlap + 1, &fs, &opener, .{ .now = now, .pinned_from = 0, .resident_only = true }) == null);
    // Fill the budget; every window stays pinned (pinned_from 0), so the next is refused.
    var w: u64 = 1;
    while (maps.get(gpa, k, len, w * window_bytes, 8, &fs, &opener, .{ .now = now, .pinned_from = 0, .resident_only = true })) |bytes| : (w += 1) {
        try std.testing.expectEqualSlices(u8, data[@intCast(w * window_bytes)..][0..8], bytes);
        try std.testing.expect(maps.mapped_bytes <= mapped_bytes_max);
    }
    const full = maps.count;
    try std.testing.expect(full >= 2 and w < windows);
    try std.testing.expect(maps.over_budget);
    try std.testing.expect(maps.mapped_bytes <= mapped_bytes_max);
    // Unpinned but recently used: still refused (random reads do not churn mappings).
    now += evict_age_min - 1;
    try std.testing.expect(maps.get(gpa, k, len, w * window_bytes, 8, &fs, &opener, .{ .now = now, .pinned_from = now, .resident_only = true }) == null);
    // Old and unpinned: the least recently used window (window 0, used at stamp 1) goes.
    now += 2;
    const moved = maps.get(gpa, k, len, w * window_bytes + 1, 8, &fs, &opener, .{ .now = now, .pinned_from = now, .resident_only = true }).?;
    try std.testing.expectEqualSlices(u8, data[@intCast(w * window_bytes + 1)..][0..8], moved);
    try std.testing.expectEqual(full, maps.count);
    for (maps.windows[0..maps.count]) |win| try std.testing.expect(win.number != 0);
    // An ordered pass over every window keeps within the budget.
    var pos: u64 = 0;
    while (pos + 600 <= len) : (pos += 4096) {
        now += evict_age_min;
        const bytes = maps.get(gpa, k, len, pos, 600, &fs, &opener, .{ .now = now, .pinned_from = now, .resident_only = true }).?;
        try std.testing.expectEqualSlices(u8, data[@intCast(pos)..][0..600], bytes);
        try std.testing.expect(maps.mapped_bytes <= mapped_bytes_max and maps.count <= windows_max);
    }
    // A file shorter than the manifest says is never mapped (pread reports it).
    const short: Key = .{ .cache = 1, .shard_id = 0 };
    try std.testing.expect(maps.get(gpa, short, len + 1, 0, 8, &fs, &opener, .{ .now = now, .pinned_from = 0, .resident_only = false }) == null);
    try std.testing.expect(!maps.over_budget);
}

test "windows of many shards are found again in any order, through the index, after moves" {
    const gpa = std.testing.allocator;
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    const len: u64 = 3 * window_bytes;
    const data = try gpa.alloc(u8, @intCast(len));
    defer gpa.free(data);
    for (data, 0..) |*b, i| b.* = @truncate(i *% 13 +% i / 509);
    try tmp.dir.writeFile(.{ .sub_path = "a", .data = data });
    var opener: TestOpener = .{ .dir = tmp.dir };
    var fs: Files = .{};
    defer fs.deinit();
    // Room for every window: 12 shards (all the same file) of 3 windows each.
    var maps: Maps = .{ .budget = random_mapped_bytes_max };
    defer maps.deinit(gpa);
    var prng = std.Random.DefaultPrng.init(7);
    const random = prng.random();
    var now: u64 = 0;
    for (0..2000) |_| {
        const k: Key = .{ .cache = random.uintLessThan(u32, 3), .shard_id = random.uintLessThan(u64, 4) };
        const at = random.uintLessThan(u64, len - 100);
        now += 1;
        const bytes = maps.get(gpa, k, len, at, 100, &fs, &opener, .{ .now = now, .pinned_from = 0, .resident_only = false }).?;
        try std.testing.expectEqualSlices(u8, data[@intCast(at)..][0..100], bytes);
    }
    // Each window was mapped once, and the index holds exactly the windows.
    try std.testing.expectEqual(@as(u64, 36), maps.mapped_total);
    try std.testing.expectEqual(@as(usize, 36), maps.count);
    var listed: usize = 0;
    for (maps.index) |i| {
        if (i == Maps.index_empty) continue;
        listed += 1;
        const w = &maps.windows[i];
        try std.testing.expect(maps.find(w.key, w.number) == w);
    }
    try std.testing.expectEqual(maps.count, listed);
    try std.testing.expect(maps.find(.{ .cache = 3, .shard_id = 0 }, 0) == null);
}

test "residentRange: a page not resident makes every range touching it not resident" {
    const page = std.heap.pageSize();
    var vec = [_]u8{ 1, 0, 1, 1 };
    const bytes: []align(std.heap.page_size_min) const u8 = @alignCast(@as([*]align(std.heap.page_size_min) const u8, @ptrFromInt(page))[0 .. 4 * page]);
    const w: Maps.Window = .{ .key = .{ .cache = 0, .shard_id = 0 }, .number = 0, .bytes = bytes, .resident = &vec, .stamp = 0 };
    try std.testing.expect(w.residentRange(0, page));
    try std.testing.expect(!w.residentRange(page - 1, 2));
    try std.testing.expect(w.residentRange(2 * page, page + 10));
}

/// Whether every page of `[offset, offset + len)` of `fd` is in the page cache now, by one
/// `cachestat(2)` (Linux 6.5); false for an empty range, or when `cachestat` is not
/// available or fails.
pub fn rangeCached(fd: posix.fd_t, offset: u64, len: u64) bool {
    if (len == 0 or offset > std.math.maxInt(i64) - len) return false;
    const page = std.heap.pageSize();
    const start = offset / page * page;
    const span = offset + len - start;
    return Maps.allCached(fd, start, @intCast(span), @intCast((span + page - 1) / page));
}

/// Reads `buf.len` bytes at `offset` of `fd` only if they are all in the page cache now
/// (`preadv2` with `RWF_NOWAIT`: never waits for the disk). A file system that cannot
/// read so (tmpfs, some network file systems: `EOPNOTSUPP`) is asked with `cachestat`
/// (`rangeCached`) instead, then read the ordinary way: pages evicted in between are read
/// from the disk (or swap). False, with `buf` unspecified, when the bytes are not all
/// cached, on a short read, or on any error: the caller then reads them the ordinary way,
/// which reports it.
pub fn readResident(fd: posix.fd_t, buf: []u8, offset: u64) bool {
    if (buf.len == 0 or offset > std.math.maxInt(i64)) return false;
    const iov = [1]posix.iovec{.{ .base = buf.ptr, .len = buf.len }};
    const rc = std.os.linux.preadv2(fd, &iov, 1, @intCast(offset), std.os.linux.RWF.NOWAIT);
    switch (std.os.linux.E.init(rc)) {
        .SUCCESS => return rc == buf.len,
        .OPNOTSUPP => {
            if (!rangeCached(fd, offset, buf.len)) return false;
            const n = posix.pread(fd, buf, offset) catch return false;
            return n == buf.len;
        },
        else => return false,
    }
}

test "readResident reads page-cache-resident bytes, and refuses what is past the end" {
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    try tmp.dir.writeFile(.{ .sub_path = "a", .data = "0123456789" });
    const f = try tmp.dir.openFile("a", .{});
    defer f.close();
    var buf: [4]u8 = undefined;
    // Just written: in the page cache (a kernel without RWF_NOWAIT for buffered reads
    // refuses it, which is allowed).
    if (readResident(f.handle, &buf, 3)) try std.testing.expectEqualStrings("3456", &buf);
    try std.testing.expect(!readResident(f.handle, &buf, 8));
    try std.testing.expect(!readResident(f.handle, buf[0..0], 0));
}

test "readResident on tmpfs, which refuses RWF_NOWAIT: cachestat, then an ordinary read" {
    var shm = std.fs.openDirAbsolute("/dev/shm", .{}) catch return error.SkipZigTest;
    defer shm.close();
    var name_buf: [64]u8 = undefined;
    const name = try std.fmt.bufPrint(&name_buf, "dataset_rt-test-{d}", .{std.os.linux.getpid()});
    shm.writeFile(.{ .sub_path = name, .data = "0123456789" }) catch return error.SkipZigTest;
    defer shm.deleteFile(name) catch {};
    const f = try shm.openFile(name, .{});
    defer f.close();
    var buf: [4]u8 = undefined;
    const iov = [1]posix.iovec{.{ .base = &buf, .len = buf.len }};
    const rc = std.os.linux.preadv2(f.handle, &iov, 1, 0, std.os.linux.RWF.NOWAIT);
    if (std.os.linux.E.init(rc) != .OPNOTSUPP) return error.SkipZigTest; // it reads with the flag
    // Without cachestat (before Linux 6.5) nothing counts as cached.
    try std.testing.expectEqual(rangeCached(f.handle, 3, 4), readResident(f.handle, &buf, 3));
    if (rangeCached(f.handle, 3, 4)) try std.testing.expectEqualStrings("3456", &buf);
    try std.testing.expect(!readResident(f.handle, &buf, 8));
}

test "hints: adjacent ranges join up to chunk_max, advice stays within the budget, planning frees room" {
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    try tmp.dir.writeFile(.{ .sub_path = "a", .data = "0123456789" ** 100 });
    var opener: TestOpener = .{ .dir = tmp.dir };
    var fs: Files = .{};
    defer fs.deinit();
    var h: Hints = .{ .chunk_max = 300 };
    defer h.deinit(&fs);
    const k0: Key = .{ .cache = 0, .shard_id = 0 };
    const k1: Key = .{ .cache = 0, .shard_id = 1 };
    const budget = 500;
    // Records of 100 bytes back to back in k0 (plan indexes 0..3), then one in k1.
    for (0..3) |i| {
        try std.testing.expect(h.room(budget, 100));
        h.add(&fs, &opener, k0, i * 100, 100, i + 1);
    }
    try std.testing.expectEqual(@as(u64, 0), h.calls); // still gathering: 300 bytes
    // A fourth would pass chunk_max: the first chunk is advised, a new one starts.
    h.add(&fs, &opener, k0, 300, 100, 4);
    try std.testing.expectEqual(@as(u64, 1), h.calls);
    try std.testing.expectEqual(@as(u64, 300), h.advised_bytes);
    // Another file: not joined.
    h.add(&fs, &opener, k1, 400, 100, 5);
    try std.testing.expectEqual(@as(u64, 2), h.calls);
    // 500 bytes advised or gathered: nothing more fits in the budget.
    try std.testing.expect(!h.room(budget, 1));
    h.flush(&fs, &opener);
    try std.testing.expectEqual(@as(u64, 3), h.calls);
    try std.testing.expectEqual(@as(u64, 500), h.bytes);
    // Planning passes the first chunk's records (not the second's): its bytes are free.
    h.reached(&fs, 3);
    try std.testing.expectEqual(@as(u64, 200), h.bytes);
    try std.testing.expect(h.room(budget, 300));
    try std.testing.expect(!h.room(budget, 301));
    h.reached(&fs, 5);
    try std.testing.expectEqual(@as(u64, 0), h.bytes);
    try std.testing.expectEqual(@as(usize, 0), h.count);
}

test "hints on a pool: each job pins its descriptor until reaped, deinit takes back or waits for every job" {
    const rt = try runtime.Runtime.open(std.testing.allocator, 1);
    defer rt.release();
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    try tmp.dir.writeFile(.{ .sub_path = "a", .data = "x" ** 4096 });
    var opener: TestOpener = .{ .dir = tmp.dir };
    var fs: Files = .{};
    // Files.deinit asserts that no entry is pinned: every job was reaped.
    defer fs.deinit();
    var h: Hints = .{ .chunk_max = 1, .pool = &rt.pool };
    defer h.deinit(&fs);
    const key: Key = .{ .cache = 0, .shard_id = 0 };
    // One chunk per byte: as many jobs as there is room for.
    var end: u64 = 0;
    while (h.room(1 << 20, 1)) : (end += 1) h.add(&fs, &opener, key, end, 1, end + 1);
    h.flush(&fs, &opener);
    try std.testing.expectEqual(@as(u64, Hints.chunks_max), end);
    try std.testing.expectEqual(end, h.calls);
    // Wait until every job ran: then reaching their ends unpins all and frees the ring.
    for (&h.jobs) |*j| {
        j.task.wait();
    }
    h.reached(&fs, end);
    try std.testing.expectEqual(@as(usize, 0), h.count);
    for (fs.entries) |e| try std.testing.expectEqual(@as(u32, 0), e.pins);
    try std.testing.expect(h.room(1 << 20, 1));
    // Queued and maybe running jobs at deinit: taken back or waited for, none left pinned.
    h.add(&fs, &opener, key, 0, 1, end + 1);
    h.add(&fs, &opener, key, 1, 1, end + 2);
    h.flush(&fs, &opener);
    h.deinit(&fs);
    for (fs.entries) |e| try std.testing.expectEqual(@as(u32, 0), e.pins);
    for (&h.jobs) |*j| try std.testing.expect(j.task.is(runtime.Task.idle));
}

test "willNeed is only a hint: a bad descriptor or a range past the end is ignored" {
    willNeed(-1, 0, 4096);
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    try tmp.dir.writeFile(.{ .sub_path = "a", .data = "abc" });
    const f = try tmp.dir.openFile("a", .{});
    defer f.close();
    willNeed(f.handle, 1 << 40, 1 << 20);
    willNeed(f.handle, std.math.maxInt(u64), 1);
    var buf: [3]u8 = undefined;
    try std.testing.expectEqual(@as(usize, 3), try f.preadAll(&buf, 0));
    try std.testing.expectEqualStrings("abc", &buf);
}

test "ShardMaps maps a shard once, within the budget, only when its file is long enough" {
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    try tmp.dir.writeFile(.{ .sub_path = "a", .data = "0123456789" });
    const f = try tmp.dir.openFile("a", .{});
    defer f.close();
    const gpa = std.testing.allocator;
    var maps: ShardMaps = .{ .budget = 16 };
    defer maps.deinit(gpa);
    const k0: Key = .{ .cache = 0, .shard_id = 0 };
    const a = maps.get(gpa, k0, 10, f.handle).?;
    try std.testing.expectEqualStrings("0123456789", a);
    try std.testing.expectEqual(a.ptr, maps.get(gpa, k0, 10, f.handle).?.ptr);
    // Just written, so resident (mincore reports the pages of a file this user wrote).
    try std.testing.expect(mappedResident(f.handle, a, 3, 5));
    // Longer than its file, or past what the budget has left: never mapped.
    try std.testing.expect(maps.get(gpa, .{ .cache = 1, .shard_id = 0 }, 11, f.handle) == null);
    try std.testing.expect(maps.get(gpa, .{ .cache = 2, .shard_id = 0 }, 7, f.handle) == null);
    try std.testing.expect(maps.get(gpa, .{ .cache = 2, .shard_id = 0 }, 7, f.handle) == null);
    try std.testing.expectEqual(@as(u64, 10), maps.mapped_bytes);
    try std.testing.expectEqualStrings("012345", maps.get(gpa, .{ .cache = 3, .shard_id = 0 }, 6, f.handle).?);
    try std.testing.expectEqual(@as(u64, 16), maps.mapped_bytes);
}
