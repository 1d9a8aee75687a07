//! The descriptor cache of one reader: shard files opened lazily and kept in a small
//! direct-mapped table, so a reader holds at most `open_files_max` cached descriptors
//! however many caches and shards a dataset has (10,000 caches must not exhaust
//! RLIMIT_NOFILE).
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

test "descriptors are cached, pinned entries are never closed under a read" {
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    try tmp.dir.writeFile(.{ .sub_path = "a", .data = "a" });
    const Opener = struct {
        dir: std.fs.Dir,
        opened: u32 = 0,
        fn open(o: *@This(), key: Key) status.Error!posix.fd_t {
            _ = key;
            o.opened += 1;
            const f = o.dir.openFile("a", .{}) catch return error.Io;
            return f.handle;
        }
    };
    var opener: Opener = .{ .dir = tmp.dir };
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
