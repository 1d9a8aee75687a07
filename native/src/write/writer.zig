//! Cache writer: fills a staging directory (store/publish.zig) with shards (records
//! appended, rotating at `max_shard_bytes` like the reference) and `index.bin`, hashing
//! every file with SHA-256 as it is written, then writes `manifest.json` last and
//! publishes the directory atomically (never replacing an existing cache unless asked).
//!
//! Invariants:
//! - Nothing appears at `<base>/<name>` until `finish` succeeds; a writer closed without
//!   finishing removes its staging directory (held under its lock until then).
//! - The bytes written depend only on the input samples and options.

const std = @import("std");
const schema = @import("../format/schema.zig");
const status = @import("../base/status.zig");
const manifest = @import("../format/manifest.zig");
const index = @import("../format/index.zig");
const lz4 = @import("../codec/lz4.zig");
const metadata_json = @import("../format/metadata_json.zig");
const runtime_mod = @import("../base/runtime.zig");
const Runtime = runtime_mod.Runtime;
const publish = @import("../store/publish.zig");

/// renameat2 flags: fail with EEXIST instead of replacing the destination; swap the two.

pub const Options = struct {
    max_shard_bytes: u64,
    prefetch_size: u64,
    compression: manifest.Compression,
    ratio: f64,
    profile: bool = false,
    /// Stored in the manifest (this project's extension key).
    fingerprint: ?[]const u8 = null,
    /// Publish by atomically exchanging with an existing cache at the destination (which
    /// is then removed) instead of refusing it: rebuilding a stale cache.
    replace: bool = false,
};

/// Timed stages (DRT_STAGE_* order).
pub const Stage = enum(u8) {
    record_encode,
    compression,
    disk_write,
    shard_flush,
    finish_index,
    finish_metadata,
    finish_manifest,
    publish,
};

/// One stage's totals.
pub const StageStats = struct {
    calls: u64 = 0,
    total_ns: u64 = 0,
    bytes: u64 = 0,
};

/// Stage timings, recorded only when profiling (a clock read costs tens of ns).
const Profile = struct {
    enabled: bool,
    stages: [std.meta.fields(Stage).len]StageStats = [_]StageStats{.{}} ** std.meta.fields(Stage).len,

    fn start(p: *const Profile) i128 {
        return if (p.enabled) std.time.nanoTimestamp() else 0;
    }

    fn stop(p: *Profile, stage: Stage, started: i128, bytes: u64) void {
        if (!p.enabled) return;
        const s = &p.stages[@intFromEnum(stage)];
        s.calls += 1;
        s.total_ns += @intCast(@max(0, std.time.nanoTimestamp() - started));
        s.bytes += bytes;
    }
};

/// One column of an append batch (see drt_column).
pub const Column = struct {
    kind: schema.Kind,
    values: ?*const anyopaque,
    offsets: ?[*]const u64,
};

/// Samples handed to one encode job at least (smaller batches are not split).
const chunk_samples_min = 64;

/// A slice of an appended batch, copied out of the caller's buffers, encoded (record
/// framing, JSON, LZ4) on a pool worker and then committed in sequence order.
const Chunk = struct {
    job: runtime_mod.Job = .{ .run = runEncode },
    w: *Writer = undefined,
    seq: u64 = 0,
    state: State = .free,
    count: usize = 0,
    /// Input: payload bytes with count + 1 offsets, field values (strings in `strings`).
    payload: std.ArrayList(u8) = .empty,
    offsets: std.ArrayList(u64) = .empty,
    values: std.ArrayList(schema.Value) = .empty,
    strings: std.ArrayList(u8) = .empty,
    /// Output: whole records back to back, their lengths and raw payload lengths.
    records: std.ArrayList(u8) = .empty,
    record_lens: std.ArrayList(u64) = .empty,
    raw_lens: std.ArrayList(u64) = .empty,
    compressed: std.ArrayList(u8) = .empty,
    encode_error: ?status.Error = null,
    profile: Profile = .{ .enabled = false },

    const State = enum { free, queued, encoded };

    fn deinit(c: *Chunk, gpa: std.mem.Allocator) void {
        inline for (.{ "payload", "offsets", "values", "strings", "records", "record_lens", "raw_lens", "compressed" }) |name| {
            @field(c, name).deinit(gpa);
        }
    }

    fn runEncode(job: *runtime_mod.Job) void {
        const c: *Chunk = @fieldParentPtr("job", job);
        const w = c.w;
        c.encode(w) catch |err| {
            c.encode_error = err; // only OutOfMemory can happen here
        };
        w.chunkEncoded(c);
    }

    /// Encodes every sample of the chunk into `records`. Pure: touches only the chunk.
    fn encode(c: *Chunk, w: *const Writer) error{OutOfMemory}!void {
        const gpa = w.gpa;
        const nf = w.fields.len;
        c.records.clearRetainingCapacity();
        c.record_lens.clearRetainingCapacity();
        c.raw_lens.clearRetainingCapacity();
        for (0..c.count) |i| {
            const payload = c.payload.items[@intCast(c.offsets.items[i])..@intCast(c.offsets.items[i + 1])];
            const start = c.records.items.len;
            var t = c.profile.start();
            try c.records.appendNTimes(gpa, 0, 8);
            try metadata_json.encodeRecord(gpa, &c.records, w.fields, c.values.items[i * nf ..][0..nf]);
            const json_len = c.records.items.len - start - 8;
            std.mem.writeInt(u64, c.records.items[start..][0..8], json_len, .little);
            c.profile.stop(.record_encode, t, json_len + 8);
            switch (w.options.compression) {
                .none => try c.records.appendSlice(gpa, payload),
                .lz4 => {
                    t = c.profile.start();
                    const bound = lz4.prependedBound(payload.len);
                    try c.compressed.ensureTotalCapacity(gpa, bound);
                    c.compressed.items.len = bound; // overwritten by the compressor
                    const n = lz4.compressPrepended(payload, c.compressed.items);
                    try c.records.appendSlice(gpa, c.compressed.items[0..n]);
                    c.profile.stop(.compression, t, payload.len);
                },
            }
            try c.record_lens.append(gpa, c.records.items.len - start);
            try c.raw_lens.append(gpa, payload.len);
        }
    }
};

pub const Writer = struct {
    gpa: std.mem.Allocator,
    runtime: *Runtime,
    options: Options,
    /// The staging directory this writer fills and publishes.
    staging: publish.Staging,
    name: []u8,
    fields: []schema.Field = &.{},
    schema_set: bool = false,
    field_names: std.ArrayList(u8) = .empty,

    shard: ?publish.HashedFile = null,
    shard_uncompressed: u64 = 0,
    shards: std.ArrayList(manifest.WriteShard) = .empty,
    index_file: publish.HashedFile,
    index_open: bool = true,
    sample_count: u64 = 0,

    /// The encode/commit pipeline. `chunks` is a ring indexed by sequence number; chunks
    /// are committed strictly in sequence order by whichever thread finds the next one
    /// encoded (`committing` makes that one thread at a time), so the bytes written do not
    /// depend on the worker count. At most prefetch_size samples plus one batch are queued.
    chunks: []Chunk = &.{},
    mutex: std.Thread.Mutex = .{},
    cond: std.Thread.Condition = .{},
    next_submit: u64 = 0,
    next_commit: u64 = 0,
    committing: bool = false,
    in_flight_samples: u64 = 0,
    /// First failure of a commit (an I/O error), raised by the next append or finish.
    async_failure: ?status.Error = null,
    async_message: [status.message_bytes_max]u8 = undefined,
    async_message_len: usize = 0,
    shard_path: std.ArrayList(u8) = .empty,
    failed: bool = false,
    profile: Profile,

    pub fn open(gpa: std.mem.Allocator, rt: *Runtime, base: []const u8, name: []const u8, options: Options) status.Error!*Writer {
        try rt.checkPid();
        try publish.checkName(name);
        if (options.fingerprint) |fp| {
            if (!std.unicode.utf8ValidateSlice(fp)) return status.fail(error.InvalidArgument, "CacheSource.fingerprint must be valid UTF-8", .{});
        }
        try publish.checkBase(base);
        if (options.max_shard_bytes == 0) return status.fail(error.InvalidArgument, "max_shard_bytes must be greater than zero", .{});
        if (options.prefetch_size == 0) return status.fail(error.InvalidArgument, "prefetch_size must be greater than zero", .{});
        if (!(std.math.isFinite(options.ratio) and options.ratio > 0)) return status.fail(error.InvalidArgument, "shard_compression.ratio must be positive and finite", .{});
        if (options.compression == .none and options.ratio != 1.0) return status.fail(error.InvalidArgument, "shard_compression.ratio must be 1.0 when algo is 'none'", .{});

        const name_copy = try gpa.dupe(u8, name);
        errdefer gpa.free(name_copy);
        var staging = try publish.Staging.create(gpa, base, name, options.replace);
        errdefer staging.discard(gpa);
        const index_file = staging.dir.createFile("index.bin", .{}) catch |err| return status.failIo(err, staging.staging_path);
        errdefer index_file.close();

        const chunk_count = @max(2, 2 * rt.num_workers);
        const chunks = try gpa.alloc(Chunk, chunk_count);
        errdefer gpa.free(chunks);
        @memset(chunks, .{});

        const fingerprint: ?[]u8 = if (options.fingerprint) |fp| try gpa.dupe(u8, fp) else null;
        errdefer if (fingerprint) |fp| gpa.free(fp);

        const w = try gpa.create(Writer);
        for (chunks) |*c| {
            c.w = w;
            c.profile.enabled = options.profile;
        }
        w.* = .{
            .chunks = chunks,
            .gpa = gpa,
            .runtime = rt.retain(),
            .options = options,
            .staging = staging,
            .name = name_copy,
            .index_file = .{ .file = index_file, .hasher = .init() },
            .profile = .{ .enabled = options.profile },
        };
        w.options.fingerprint = fingerprint;
        return w;
    }

    pub fn setSchema(w: *Writer, fields: []const schema.Field) status.Error!void {
        if (w.schema_set) return status.fail(error.InvalidArgument, "the writer's schema is already set", .{});
        if (!schema.isSorted(fields)) return status.fail(error.InvalidArgument, "schema fields must be sorted by name without duplicates", .{});
        var total: usize = 0;
        for (fields) |f| {
            if (!std.unicode.utf8ValidateSlice(f.name)) return status.fail(error.InvalidArgument, "metadata keys must be valid UTF-8", .{});
            for ([_][]const u8{ "cache_id", "sample_id", "weight" }) |reserved| {
                if (std.mem.eql(u8, f.name, reserved)) return status.fail(error.InvalidArgument, "metadata field '{s}' is reserved", .{reserved});
            }
            total += f.name.len;
        }
        try w.field_names.ensureTotalCapacity(w.gpa, total);
        const copy = try w.gpa.alloc(schema.Field, fields.len);
        for (fields, copy) |f, *c| {
            const start = w.field_names.items.len;
            w.field_names.appendSliceAssumeCapacity(f.name);
            c.* = .{ .name = w.field_names.items[start..], .kind = f.kind };
        }
        w.fields = copy;
        w.schema_set = true;
    }

    /// Appends `count` samples (see drt_writer_append): validates them and copies them
    /// into chunks that the pool encodes while the caller produces the next batch. Blocks
    /// while prefetch_size samples are still queued (one more batch may wait). After an error the
    /// writer is poisoned: only close is allowed.
    pub fn append(w: *Writer, count: u64, payloads: [*]const u8, offsets: [*]const u64, columns: [*]const Column) status.Error!void {
        try w.runtime.checkPid();
        if (w.failed or w.staging.published) return status.fail(error.InvalidArgument, "the writer cannot accept samples after a failure or finish", .{});
        if (!w.schema_set) return status.fail(error.InvalidArgument, "drt_writer_set_schema must be called before appending", .{});
        errdefer w.failed = true;
        try w.checkAsync();
        for (w.fields, 0..) |f, c| {
            if (columns[c].kind != f.kind) return status.fail(error.InvalidArgument, "column {d} has the wrong kind", .{c});
            if (columns[c].values == null and count > 0) return status.fail(error.InvalidArgument, "column {d} has no values", .{c});
            if (f.kind == .string and columns[c].offsets == null) return status.fail(error.InvalidArgument, "string column {d} has no offsets", .{c});
        }
        const n: usize = @intCast(count);
        for (0..n) |i| {
            if (offsets[i + 1] < offsets[i]) return status.fail(error.InvalidArgument, "payload offsets must not decrease", .{});
            if (w.options.compression == .lz4 and offsets[i + 1] - offsets[i] > std.math.maxInt(u32)) {
                return status.fail(error.InvalidArgument, "lz4 payloads must be smaller than 4 GiB", .{});
            }
        }
        const parts = @min(w.runtime.num_workers, @max(1, n / chunk_samples_min));
        var start: usize = 0;
        for (0..parts) |p| {
            const end = if (p + 1 == parts) n else start + n / parts;
            const chunk = try w.acquireChunk(end - start);
            w.fillChunk(chunk, start, end, payloads, offsets, columns) catch |err| {
                w.releaseUnsubmitted(chunk);
                return err;
            };
            w.runtime.pool.submit(&chunk.job);
            start = end;
        }
    }

    /// Waits for a free chunk and room under the in-flight bound, then reserves both.
    fn acquireChunk(w: *Writer, samples: usize) status.Error!*Chunk {
        w.mutex.lock();
        defer w.mutex.unlock();
        // One batch may queue while up to prefetch_size samples are still being encoded
        // or committed, so the caller produces the next batch while the pool works.
        const bound = w.options.prefetch_size + samples;
        while (true) {
            if (w.async_failure != null) break;
            const chunk = &w.chunks[@intCast(w.next_submit % w.chunks.len)];
            if (chunk.state == .free and w.in_flight_samples + samples <= bound) break;
            w.cond.wait(&w.mutex);
        }
        if (w.async_failure) |err| return status.failText(err, w.async_message[0..w.async_message_len]);
        const chunk = &w.chunks[@intCast(w.next_submit % w.chunks.len)];
        chunk.seq = w.next_submit;
        chunk.state = .queued;
        chunk.count = samples;
        chunk.encode_error = null;
        w.next_submit += 1;
        w.in_flight_samples += samples;
        return chunk;
    }

    /// A chunk reserved but not submitted (its input failed validation): its slot is
    /// skipped by the commit sequence (the writer is poisoned anyway).
    fn releaseUnsubmitted(w: *Writer, chunk: *Chunk) void {
        chunk.encode_error = error.InvalidArgument;
        w.chunkEncoded(chunk);
    }

    /// Copies samples [start, end) into the chunk, validating values as it goes.
    fn fillChunk(w: *Writer, c: *Chunk, start: usize, end: usize, payloads: [*]const u8, offsets: [*]const u64, columns: [*]const Column) status.Error!void {
        const gpa = w.gpa;
        const nf = w.fields.len;
        const first: usize = @intCast(offsets[start]);
        const last: usize = @intCast(offsets[end]);
        c.payload.clearRetainingCapacity();
        try c.payload.appendSlice(gpa, payloads[first..last]);
        c.offsets.clearRetainingCapacity();
        for (start..end + 1) |i| try c.offsets.append(gpa, offsets[i] - offsets[start]);
        // Reserve the string bytes first so slices into `strings` never move.
        var string_bytes: usize = 0;
        for (w.fields, 0..) |f, col| {
            if (f.kind != .string) continue;
            const offs = columns[col].offsets.?;
            if (offs[end] < offs[start]) return status.fail(error.InvalidArgument, "string offsets must not decrease", .{});
            string_bytes += @intCast(offs[end] - offs[start]);
        }
        c.strings.clearRetainingCapacity();
        try c.strings.ensureTotalCapacity(gpa, string_bytes);
        c.values.clearRetainingCapacity();
        try c.values.ensureTotalCapacity(gpa, (end - start) * nf);
        for (start..end) |i| {
            for (w.fields, 0..) |f, col| {
                var v = try columnValue(f, columns[col], i);
                if (v == .string) {
                    const at = c.strings.items.len;
                    c.strings.appendSliceAssumeCapacity(v.string);
                    v = .{ .string = c.strings.items[at..][0..v.string.len] };
                }
                c.values.appendAssumeCapacity(v);
            }
        }
    }

    fn columnValue(field: schema.Field, column: Column, i: usize) status.Error!schema.Value {
        switch (field.kind) {
            .bool => {
                const b = @as([*]const u8, @ptrCast(column.values.?))[i];
                if (b > 1) return status.fail(error.InvalidArgument, "metadata field '{s}' has an invalid bool", .{field.name});
                return .{ .bool = b == 1 };
            },
            .int => return .{ .int = @as([*]const i64, @ptrCast(@alignCast(column.values.?)))[i] },
            .float => {
                const x = @as([*]const f64, @ptrCast(@alignCast(column.values.?)))[i];
                if (!std.math.isFinite(x)) return status.fail(error.InvalidArgument, "metadata field '{s}' must be a finite float", .{field.name});
                return .{ .float = x };
            },
            .string => {
                const offs = column.offsets.?;
                if (offs[i + 1] < offs[i]) return status.fail(error.InvalidArgument, "string offsets must not decrease", .{});
                const s = @as([*]const u8, @ptrCast(column.values.?))[@intCast(offs[i])..@intCast(offs[i + 1])];
                if (!std.unicode.utf8ValidateSlice(s)) return status.fail(error.InvalidArgument, "metadata field '{s}' is not valid UTF-8", .{field.name});
                return .{ .string = s };
            },
        }
    }

    /// Called (on a worker, or inline for a skipped chunk) when a chunk is encoded: commits
    /// it and every following encoded chunk in sequence order, unless another thread is
    /// already committing (it will pick them up).
    fn chunkEncoded(w: *Writer, done: *Chunk) void {
        w.mutex.lock();
        done.state = .encoded;
        if (w.committing) {
            w.mutex.unlock();
            return;
        }
        w.committing = true;
        while (true) {
            const c = &w.chunks[@intCast(w.next_commit % w.chunks.len)];
            if (w.next_commit == w.next_submit or c.state != .encoded) break;
            w.mutex.unlock();
            var failure: ?status.Error = null;
            if (w.async_failure == null) {
                if (c.encode_error) |err| {
                    if (err == error.OutOfMemory) failure = status.fail(error.OutOfMemory, "out of memory while encoding records", .{});
                } else {
                    w.commitChunk(c) catch |err| {
                        failure = err;
                    };
                }
            }
            w.mutex.lock();
            if (failure) |err| {
                const msg = status.lastMessage();
                const len = @min(msg.len, w.async_message.len);
                @memcpy(w.async_message[0..len], msg[0..len]);
                w.async_message_len = len;
                w.async_failure = err;
            }
            c.state = .free;
            w.in_flight_samples -= c.count;
            w.next_commit += 1;
            w.cond.broadcast();
        }
        w.committing = false;
        w.mutex.unlock();
    }

    /// Appends one encoded chunk's records to the shards and index (single-threaded).
    fn commitChunk(w: *Writer, c: *Chunk) status.Error!void {
        const gpa = w.gpa;
        for (c.profile.stages, &w.profile.stages) |from, *to| {
            to.calls += from.calls;
            to.total_ns += from.total_ns;
            to.bytes += from.bytes;
        }
        c.profile.stages = [_]StageStats{.{}} ** c.profile.stages.len;
        var at: usize = 0;
        for (c.record_lens.items, c.raw_lens.items) |record_len, raw_len| {
            const record = c.records.items[at..][0..@intCast(record_len)];
            at += @intCast(record_len);
            if (w.shard) |*shard| {
                if (shard.written > 0 and shard.written + record_len > w.options.max_shard_bytes) try w.closeShard();
            }
            if (w.shard == null) try w.openShard();
            const t = w.profile.start();
            const shard = &w.shard.?;
            const offset = shard.written;
            try shard.append(gpa, record, w.shard_path.items);
            w.shard_uncompressed += raw_len;
            const row = index.encode(.{ .shard_id = w.shards.items.len, .offset = offset, .byte_len = record_len });
            try w.index_file.append(gpa, &row, w.staging.staging_path);
            w.sample_count += 1;
            w.profile.stop(.disk_write, t, record_len + index.row_bytes);
        }
    }

    /// Raises the first commit failure, if any.
    fn checkAsync(w: *Writer) status.Error!void {
        w.mutex.lock();
        defer w.mutex.unlock();
        if (w.async_failure) |err| return status.failText(err, w.async_message[0..w.async_message_len]);
    }

    /// Waits until every submitted chunk is committed (or skipped after a failure).
    fn drain(w: *Writer) void {
        w.mutex.lock();
        defer w.mutex.unlock();
        while (w.next_commit != w.next_submit) w.cond.wait(&w.mutex);
    }

    fn openShard(w: *Writer) status.Error!void {
        var name_buf: [32]u8 = undefined;
        const name = manifest.shardName(&name_buf, w.shards.items.len);
        // The shard's path, kept for error messages while it is being written.
        w.shard_path.clearRetainingCapacity();
        try w.shard_path.print(w.gpa, "{s}/shards/{s}", .{ w.staging.staging_path, name });
        var shards_dir = w.staging.dir.openDir("shards", .{}) catch |err| return status.failIo(err, w.staging.staging_path);
        defer shards_dir.close();
        const file = shards_dir.createFile(name, .{ .exclusive = true }) catch |err| return status.failIo(err, w.shard_path.items);
        w.shard = .{ .file = file, .hasher = .init() };
        w.shard_uncompressed = 0;
    }

    fn closeShard(w: *Writer) status.Error!void {
        const t = w.profile.start();
        var shard = &w.shard.?;
        defer w.profile.stop(.shard_flush, t, 0);
        const digest = try shard.finish(w.shard_path.items);
        const entry: manifest.WriteShard = .{ .uncompressed_byte_len = w.shard_uncompressed, .byte_len = shard.written, .sha256 = digest };
        shard.deinit(w.gpa, false);
        w.shard = null;
        try w.shards.append(w.gpa, entry);
    }

    /// See drt_writer_finish.
    pub fn finish(w: *Writer) status.Error!void {
        try w.runtime.checkPid();
        if (w.failed or w.staging.published) return status.fail(error.InvalidArgument, "the writer cannot finish after a failure or finish", .{});
        errdefer w.failed = true;
        w.drain();
        try w.checkAsync();
        if (w.sample_count == 0) return status.fail(error.InvalidArgument, "cache source yielded no samples", .{});
        try w.closeShard();
        var t = w.profile.start();
        const index_sha = try w.index_file.finish(w.staging.staging_path);
        w.index_open = false;
        w.profile.stop(.finish_index, t, w.index_file.written);

        t = w.profile.start();
        const metadata_sha = blk: {
            const file = w.staging.dir.openFile("metadata.arrow", .{}) catch |err| return status.failIo(err, w.staging.staging_path);
            defer file.close();
            file.sync() catch |err| return status.failIo(err, w.staging.staging_path);
            break :blk (try publish.hashFile(file, w.staging.staging_path)).sha256;
        };
        w.profile.stop(.finish_metadata, t, 0);
        t = w.profile.start();

        var text: std.ArrayList(u8) = .empty;
        defer text.deinit(w.gpa);
        try manifest.write(w.gpa, &text, .{
            .source_name = w.name,
            .sample_count = w.sample_count,
            .fields = w.fields,
            .metadata_sha256 = metadata_sha,
            .index_sha256 = index_sha,
            .shards = w.shards.items,
            .compression = w.options.compression,
            .ratio = w.options.ratio,
            .fingerprint = w.options.fingerprint,
        });
        try w.staging.writeManifest(text.items);
        w.profile.stop(.finish_manifest, t, text.items.len);
        t = w.profile.start();
        defer w.profile.stop(.publish, t, 0);
        try w.staging.rename(w.options.replace);
    }

    /// Releases everything; removes the staging directory unless the cache was published.
    pub fn close(w: *Writer) void {
        const gpa = w.gpa;
        const forked = if (w.runtime.checkPid()) |_| false else |_| true;
        if (!forked) w.drain(); // no job may touch the writer after this
        for (w.chunks) |*c| c.deinit(gpa);
        gpa.free(w.chunks);
        if (w.shard) |*shard| shard.deinit(gpa, true);
        w.index_file.deinit(gpa, w.index_open);
        w.staging.close(gpa, forked);
        w.runtime.release();
        w.shards.deinit(gpa);
        w.shard_path.deinit(gpa);
        w.field_names.deinit(gpa);
        gpa.free(w.fields);
        gpa.free(w.name);
        if (w.options.fingerprint) |fp| gpa.free(fp);
        gpa.destroy(w);
    }

    pub fn stagingPath(w: *const Writer) []const u8 {
        return w.staging.staging_path;
    }
};

