//! The descriptor cache of one reader: shard files opened lazily and kept in a small
//! direct-mapped table, so a reader holds at most `open_files_max` cached descriptors
//! however many caches and shards a dataset has (10,000 caches must not exhaust
//! RLIMIT_NOFILE). And `Maps`: a reader's read-only shard mappings, for small reads of
//! page-cache-resident records.
//!
//! Invariants:
//! - An entry is pinned while a read on it may be in flight and is never closed then: a
//!   read whose entry is pinned by another file gets an uncached descriptor of its own,
//!   closed on release.
//! - Only the owning thread touches the table, so pins need no atomics.

const std = @import("std");
const posix = std.posix;
const status = @import("../base/status.zig");

/// Descriptors a reader keeps open at most.
pub const open_files_max = 64;

/// Identifies a file: a cache's position in its dataset and a shard number.
pub const Key = struct {
    cache: u32,
    shard_id: u64,

    fn slot(k: Key) usize {
        return @intCast((@as(u64, k.cache) *% 0x9E3779B97F4A7C15 +% k.shard_id) % open_files_max);
    }
};

pub const Files = struct {
    entries: [open_files_max]Entry = [_]Entry{.{}} ** open_files_max,

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

    /// The descriptor of `key`, opened with `opener.open(key)` when it is not cached.
    /// Pinned until `release`.
    pub fn acquire(fs: *Files, key: Key, opener: anytype) status.Error!Handle {
        const h = key.slot();
        const entry = &fs.entries[h];
        if (entry.fd >= 0 and std.meta.eql(entry.key, key)) {
            entry.pins += 1;
            return .{ .fd = entry.fd, .entry = h };
        }
        const fd = try opener.open(key);
        if (entry.pins > 0) return .{ .fd = fd, .entry = null };
        if (entry.fd >= 0) posix.close(entry.fd);
        entry.* = .{ .key = key, .fd = fd, .pins = 1 };
        return .{ .fd = fd, .entry = h };
    }

    pub fn release(fs: *Files, handle: Handle) void {
        if (handle.entry) |h| {
            std.debug.assert(fs.entries[h].pins > 0);
            fs.entries[h].pins -= 1;
        } else posix.close(handle.fd);
    }

    /// Precondition: every handle released.
    pub fn deinit(fs: *Files) void {
        for (&fs.entries) |*e| {
            std.debug.assert(e.pins == 0);
            if (e.fd >= 0) posix.close(e.fd);
            e.fd = -1;
        }
    }
};

/// Shards mapped at most by one reader, and their bytes at most (further shards are read
/// with positioned reads): bounds the address space, the page tables and the mapped
/// pages a reader can hold.
pub const maps_max = 64;
pub const mapped_bytes_max = 1 << 30;

/// The read-only shared mappings of one reader's shards, made on first use, with a
/// snapshot of which pages were in the page cache then (`mincore`). A small read of
/// resident pages is served from the mapping (no system call, no copy into a read
/// buffer); anything else goes through the I/O backend, so cold data is still read with
/// many requests in flight instead of one page fault at a time on the consumer thread.
///
/// A shard is mapped only when its file is at least `want_len` bytes (the manifest's
/// length): cache files are never changed once published, so the mapping stays valid. A
/// shard truncated after it was mapped is a corrupt cache and touching its lost pages
/// raises SIGBUS, the risk the memory-mapped index.bin already carries.
///
/// Mapped pages count in the process's resident set (shared page-cache pages, not
/// anonymous memory) once touched, until the mappings are dropped with the reader: a
/// reader that touches every small record of a shard has the whole shard resident.
///
/// Invariant: at most `maps_max` shards and `mapped_bytes_max` bytes are mapped; a key
/// seen once keeps its outcome (mapped, or null: read with positioned reads) until
/// `deinit`.
pub const Maps = struct {
    entries: std.AutoHashMapUnmanaged(Key, ?Mapping) = .empty,
    mapped: u32 = 0,
    mapped_bytes: u64 = 0,

    pub const Mapping = struct {
        bytes: []align(std.heap.page_size_min) const u8,
        /// One byte per page (mincore's vector): bit 0 set when the page was resident.
        resident: []u8,
        page_shift: u6,

        /// Whether every page of `[offset, offset + len)` (inside the mapping, len > 0)
        /// was resident when the shard was mapped.
        pub fn residentRange(m: *const Mapping, offset: u64, len: u64) bool {
            std.debug.assert(len > 0 and offset + len <= m.bytes.len);
            const first: usize = @intCast(offset >> m.page_shift);
            const last: usize = @intCast((offset + len - 1) >> m.page_shift);
            for (m.resident[first .. last + 1]) |v| {
                if (v & 1 == 0) return false;
            }
            return true;
        }
    };

    /// The mapping of `key` (`want_len` bytes), made on first use from the descriptor
    /// `files` gives (`opener`), or null when it is not mapped: the file is shorter than
    /// `want_len`, mapping failed, or `maps_max` shards or `mapped_bytes_max` bytes are
    /// mapped already.
    pub fn get(m: *Maps, gpa: std.mem.Allocator, key: Key, want_len: u64, files: *Files, opener: anytype) ?Mapping {
        if (m.entries.get(key)) |e| return e;
        if (m.mapped >= maps_max or want_len > mapped_bytes_max - m.mapped_bytes) return null;
        const entry = m.entries.getOrPut(gpa, key) catch return null;
        entry.value_ptr.* = mapShard(gpa, key, want_len, files, opener);
        if (entry.value_ptr.* != null) {
            m.mapped += 1;
            m.mapped_bytes += want_len;
        }
        return entry.value_ptr.*;
    }

    fn mapShard(gpa: std.mem.Allocator, key: Key, want_len: u64, files: *Files, opener: anytype) ?Mapping {
        if (want_len == 0 or want_len > std.math.maxInt(usize)) return null;
        const handle = files.acquire(key, opener) catch return null;
        defer files.release(handle);
        const st = posix.fstat(handle.fd) catch return null;
        if (st.size < 0 or @as(u64, @intCast(st.size)) < want_len) return null;
        const len: usize = @intCast(want_len);
        const page = std.heap.pageSize();
        const pages = std.math.divCeil(usize, len, page) catch unreachable;
        const resident = gpa.alloc(u8, pages) catch return null;
        const bytes = posix.mmap(null, len, posix.PROT.READ, .{ .TYPE = .SHARED }, handle.fd, 0) catch {
            gpa.free(resident);
            return null;
        };
        // Refused (for example for a file this user could not write: the kernel then
        // reports only pages mapped here): nothing counts as resident.
        posix.mincore(@constCast(bytes.ptr), len, resident.ptr) catch @memset(resident, 0);
        return .{ .bytes = bytes, .resident = resident, .page_shift = @intCast(std.math.log2_int(usize, page)) };
    }

    pub fn deinit(m: *Maps, gpa: std.mem.Allocator) void {
        var it = m.entries.valueIterator();
        while (it.next()) |e| {
            if (e.*) |mapping| {
                posix.munmap(mapping.bytes);
                gpa.free(mapping.resident);
            }
        }
        m.entries.deinit(gpa);
        m.* = .{};
    }
};

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

test "descriptors are cached, pinned entries are never closed under a read" {
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    try tmp.dir.writeFile(.{ .sub_path = "a", .data = "a" });
    var opener: TestOpener = .{ .dir = tmp.dir };
    var fs: Files = .{};
    defer fs.deinit();
    const k1: Key = .{ .cache = 0, .shard_id = 1 };
    const a = try fs.acquire(k1, &opener);
    const b = try fs.acquire(k1, &opener);
    try std.testing.expectEqual(a.fd, b.fd);
    try std.testing.expectEqual(@as(u32, 1), opener.opened);
    // A key that maps to the same entry while it is pinned gets a private descriptor.
    var other: Key = .{ .cache = 0, .shard_id = 1 + open_files_max };
    while (other.slot() != k1.slot()) other.shard_id += 1;
    const c = try fs.acquire(other, &opener);
    try std.testing.expect(c.entry == null);
    fs.release(c);
    fs.release(a);
    fs.release(b);
    // Unpinned: the entry is reused for the other key.
    const d = try fs.acquire(other, &opener);
    try std.testing.expect(d.entry != null);
    fs.release(d);
}

test "shards are mapped once, with their resident pages, within maps_max" {
    const gpa = std.testing.allocator;
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    const page = std.heap.pageSize();
    const data = try gpa.alloc(u8, 3 * page + 10);
    defer gpa.free(data);
    for (data, 0..) |*b, i| b.* = @truncate(i *% 7);
    try tmp.dir.writeFile(.{ .sub_path = "a", .data = data });
    var opener: TestOpener = .{ .dir = tmp.dir };
    var fs: Files = .{};
    defer fs.deinit();
    var maps: Maps = .{};
    defer maps.deinit(gpa);
    const k: Key = .{ .cache = 0, .shard_id = 0 };
    const m = maps.get(gpa, k, data.len, &fs, &opener).?;
    try std.testing.expectEqualSlices(u8, data, m.bytes);
    // Just written: every page is in the page cache.
    try std.testing.expect(m.residentRange(0, data.len));
    try std.testing.expect(m.residentRange(page - 1, 2));
    _ = maps.get(gpa, k, data.len, &fs, &opener).?;
    try std.testing.expectEqual(@as(u32, 1), maps.mapped);
    // A file shorter than the manifest says is never mapped (pread reports it), and the
    // outcome is kept.
    const short: Key = .{ .cache = 1, .shard_id = 0 };
    try std.testing.expect(maps.get(gpa, short, data.len + 1, &fs, &opener) == null);
    try std.testing.expect(maps.get(gpa, short, data.len + 1, &fs, &opener) == null);
    try std.testing.expectEqual(@as(u32, 1), maps.mapped);
    // At most maps_max mappings.
    for (2..maps_max + 5) |c| _ = maps.get(gpa, .{ .cache = @intCast(c), .shard_id = 0 }, data.len, &fs, &opener);
    try std.testing.expectEqual(@as(u32, maps_max), maps.mapped);
    try std.testing.expect(maps.get(gpa, .{ .cache = 1000, .shard_id = 0 }, data.len, &fs, &opener) == null);
    try std.testing.expectEqual(@as(u64, maps_max * data.len), maps.mapped_bytes);
    // At most mapped_bytes_max bytes (a shard that would pass it is not even opened).
    var few: Maps = .{};
    defer few.deinit(gpa);
    few.mapped_bytes = mapped_bytes_max - data.len + 1;
    const opened = opener.opened;
    try std.testing.expect(few.get(gpa, .{ .cache = 2000, .shard_id = 0 }, data.len, &fs, &opener) == null);
    try std.testing.expectEqual(opened, opener.opened);
    // A page marked not resident makes every range touching it not resident.
    var copy = m;
    var vec = [_]u8{ 1, 0, 1, 1 };
    copy.resident = &vec;
    try std.testing.expect(copy.residentRange(0, page));
    try std.testing.expect(!copy.residentRange(page - 1, 2));
    try std.testing.expect(copy.residentRange(2 * page, page + 10));
}
