//! Byte buffers that are written before they are read (read targets, staging copies,
//! download buffers), allocated without the fill that safety-checked builds give every
//! `Allocator.alloc`: `alloc` writes `undefined` (0xaa) over every byte it returns, and
//! `free` again before giving the memory back, which for a buffer of a megabyte costs
//! about as much as the read or copy it is made for and touches every page up front.
//!
//! Invariant: memory from `allocUninit` is freed with `freeUninit` (same allocator), never
//! with `Allocator.free` (which would fill it first, only wasted time) and never read
//! before it is written.

const std = @import("std");

/// `n` uninitialized bytes. Free with `freeUninit`.
pub fn allocUninit(gpa: std.mem.Allocator, n: usize) error{OutOfMemory}![]u8 {
    if (n == 0) return &.{};
    const p = gpa.rawAlloc(n, .@"1", @returnAddress()) orelse return error.OutOfMemory;
    return p[0..n];
}

/// Frees bytes from `allocUninit` (or an empty slice) without filling them first.
pub fn freeUninit(gpa: std.mem.Allocator, mem: []u8) void {
    if (mem.len > 0) gpa.rawFree(mem, .@"1", @returnAddress());
}

test "allocUninit and freeUninit: empty and non-empty buffers, no leak" {
    const gpa = std.testing.allocator;
    const empty = try allocUninit(gpa, 0);
    try std.testing.expectEqual(@as(usize, 0), empty.len);
    freeUninit(gpa, empty);
    const buf = try allocUninit(gpa, 4096);
    defer freeUninit(gpa, buf);
    try std.testing.expectEqual(@as(usize, 4096), buf.len);
    @memset(buf, 7);
    try std.testing.expectEqual(@as(u8, 7), buf[4095]);
}

test "allocUninit reports OutOfMemory" {
    var failing = std.testing.FailingAllocator.init(std.testing.allocator, .{ .fail_index = 0 });
    try std.testing.expectError(error.OutOfMemory, allocUninit(failing.allocator(), 16));
}
