//! One record's bytes after they were read: split into embedded JSON and stored payload
//! (format/shard.zig) and, for LZ4 shards, the payload decompressed. Iterators and lookups
//! share these helpers.

const std = @import("std");
const status = @import("../base/status.zig");
const lz4 = @import("../codec/lz4.zig");

/// Sets a byte list's length to `n` without initializing new bytes (a read or a
/// decompression overwrites them next). `resize` would write `undefined` (0xaa) over them
/// in safety-checked builds: a memset that showed up as 20% of large-record reads.
pub fn growUninit(list: *std.ArrayList(u8), gpa: std.mem.Allocator, n: usize) error{OutOfMemory}!void {
    try list.ensureTotalCapacity(gpa, n);
    list.items.len = n;
}

/// Decompresses a size-prepended LZ4 payload onto the end of `out`; returns its length.
pub fn appendDecompressed(out: *std.ArrayList(u8), gpa: std.mem.Allocator, stored: []const u8) status.Error!u64 {
    const raw_len = lz4.prependedSize(stored) catch |err|
        return status.fail(error.InvalidCache, "failed to decompress lz4 payload: {s}", .{lz4.describe(err)});
    // An LZ4 block expands at most ~255x; a larger size prefix is corrupt, and must not
    // size an allocation.
    if (raw_len > 255 * @as(u64, stored.len) + 64) {
        return status.fail(error.InvalidCache, "failed to decompress lz4 payload: size prefix {d} is larger than a {d}-byte block can hold", .{ raw_len, stored.len });
    }
    const at = out.items.len;
    try growUninit(out, gpa, at + raw_len);
    lz4.decompressPrepended(stored, out.items[at..][0..raw_len]) catch |err|
        return status.fail(error.InvalidCache, "failed to decompress lz4 payload: {s}", .{lz4.describe(err)});
    return raw_len;
}

test "appendDecompressed round-trips and rejects corrupt prefixes" {
    const gpa = std.testing.allocator;
    const text = "abcabcabcabcabcabcabcabcabcabcabc-the-end";
    var block: [256]u8 = undefined;
    const stored = block[0..lz4.compressPrepended(text, &block)];
    var out: std.ArrayList(u8) = .empty;
    defer out.deinit(gpa);
    try out.appendSlice(gpa, "xy");
    try std.testing.expectEqual(@as(u64, text.len), try appendDecompressed(&out, gpa, stored));
    try std.testing.expectEqualStrings("xy" ++ text, out.items);
    var bad = block;
    std.mem.writeInt(u32, bad[0..4], 1 << 30, .little);
    try std.testing.expectError(error.InvalidCache, appendDecompressed(&out, gpa, bad[0..stored.len]));
    try std.testing.expectError(error.InvalidCache, appendDecompressed(&out, gpa, "\x01"));
}
