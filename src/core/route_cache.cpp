// Building the in-memory routing table (see route_cache.hpp).
#include "core/route_cache.hpp"

#include <algorithm>
#include <cstring>
#include <sys/mman.h>

#include <cstdint>
#include <stdexcept>

namespace sharding {

namespace {

// `bytes` of zeroes in cache memory, 64-byte aligned (a bucket is one cache
// line); *raw gets what to free, *allocated how much was allocated. A large table (8 MB and more: 400,000 pins
// and more) is aligned to 2 MB and asked to lie in transparent huge pages,
// where the system allows them: a random lookup then needs no page walk
// (under a hypervisor, a walk of two page tables), which took a quarter of
// a pinned key's time at 1,000,000 pins (docs/directory.md). It costs up to
// 2 MB more per table.
void *aligned_zeroed(size_t bytes, void **raw, size_t *allocated) {
    constexpr size_t huge_page = size_t{2} << 20;
    const size_t align = bytes >= 4 * huge_page ? huge_page : 64;
    char *p = CacheAllocator<char>().allocate(bytes + align);
    *raw = p;
    *allocated = bytes + align;
    char *aligned = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(p) + align - 1) & ~uintptr_t{align - 1});
#ifdef MADV_HUGEPAGE
    // Advice only: where it is refused the table lies in small pages.
    if (align == huge_page) (void)madvise(aligned, bytes & ~(huge_page - 1), MADV_HUGEPAGE);
#endif
    std::memset(aligned, 0, bytes);
    return aligned;
}

void free_raw(void *raw) {
    if (raw != nullptr) CacheAllocator<char>().deallocate(static_cast<char *>(raw), 0);
}

}  // namespace

void PinTable::release() {
    free_raw(slots_raw_);
    free_raw(filter_raw_);
    slots_raw_ = filter_raw_ = nullptr;
    slots_ = nullptr;
    filter_ = nullptr;
    nslots_ = nbuckets_ = filter_words_ = slots_bytes_ = filter_bytes_ = 0;
    count_ = tombstones_ = 0;
}

template <class Next>
void PinTable::fill(size_t n, size_t capacity, size_t long_bytes, bool dups, Next next) {
    if (long_bytes > UINT32_MAX || n > INT32_MAX) throw std::length_error("too many pinned key bytes");
    // At most 3/4 full when built, 7/8 before a rehash (upsert).
    const size_t pins = std::max(n, capacity);
    const size_t buckets = std::max<size_t>(4, (pins * 4 / 3 + bucket_slots - 1) / bucket_slots + 1);
    const size_t words = std::max<size_t>(8, (pins * filter_bits_per_pin + 63) / 64);
    struct Raw {  // freed unless swapped in
        void *p = nullptr;
        ~Raw() { free_raw(p); }
    } slots_raw, filter_raw;
    size_t slots_bytes, filter_bytes;
    Slot *slots = static_cast<Slot *>(aligned_zeroed(buckets * bucket_slots * sizeof(Slot), &slots_raw.p, &slots_bytes));
    uint64_t *filter = static_cast<uint64_t *>(aligned_zeroed(words * sizeof(uint64_t), &filter_raw.p, &filter_bytes));
    CacheString text;
    text.reserve(long_bytes);
    const size_t nslots = buckets * bucket_slots;
    size_t count = 0;
    for (size_t k = 0; k < n; k++) {
        const Entry e = next();
        const KeyRef key = e.key;
        const uint64_t h = e.hash;
        const int32_t node = e.node;
        const Probe q(h, key.data, key.len);
        size_t i = bucket_of(h, buckets) * bucket_slots;
        bool replaced = false;
        while ((slots[i].w0 & 0xff) != code_empty) {
            // The primary key makes duplicates impossible; keep the last anyway.
            if (dups && q.holds(slots[i], text.data(), key.data, key.len)) {
                set_node(slots[i], node);
                replaced = true;
                break;
            }
            if (++i == nslots) i = 0;
        }
        if (replaced) continue;
        slots[i].w0 = q.w0 | (static_cast<uint64_t>(node) << 8);
        slots[i].w1 = q.w1;
        if (key.len > inline_bytes) {
            slots[i].w0 |= static_cast<uint64_t>(text.size()) << 32;
            text.append(key.data, key.len);
        }
        filter[filter_word(h, words)] |= filter_bits(h);
        count++;
    }
    release();
    slots_ = slots;
    filter_ = filter;
    slots_raw_ = slots_raw.p;
    filter_raw_ = filter_raw.p;
    slots_raw.p = filter_raw.p = nullptr;
    keys_.swap(text);
    nslots_ = nslots;
    nbuckets_ = buckets;
    slots_bytes_ = slots_bytes;
    filter_bytes_ = filter_bytes;
    filter_words_ = words;
    count_ = count;
    tombstones_ = 0;
}

void PinTable::build(const KeyRef *keys, const uint64_t *hashes, const int32_t *nodes, size_t n, size_t capacity) {
    size_t total = 0;
    for (size_t k = 0; k < n; k++)
        if (keys[k].len > inline_bytes) total += keys[k].len;
    for (size_t k = 0; k < n; k++)
        if (nodes[k] < 0 || nodes[k] > max_node) throw std::length_error("too many nodes named by pins");
    size_t k = 0;
    fill(n, capacity, total, true, [&] {
        const Entry e{keys[k], hashes[k], nodes[k]};
        k++;
        return e;
    });
}

void PinTable::build(const std::vector<std::string> &keys, const std::vector<uint64_t> &hashes,
                     const std::vector<int32_t> &nodes, size_t capacity) {
    std::vector<KeyRef> refs;
    refs.reserve(keys.size());
    for (const std::string &k : keys) refs.push_back(KeyRef{k.data(), k.size()});
    build(refs.data(), hashes.data(), nodes.data(), keys.size(), capacity);
}

PinTable::KeyRef PinTable::key_ref(const Slot &s, char (&buf)[inline_bytes]) const {
    const uint64_t code = s.w0 & 0xff;
    if (code == code_long) return KeyRef{keys_.data() + (s.w0 >> 32), static_cast<uint32_t>(s.w1)};
    const uint32_t lo = static_cast<uint32_t>(s.w0 >> 32);
    std::memcpy(buf, &lo, 4);
    std::memcpy(buf + 4, &s.w1, 8);
    return KeyRef{buf, static_cast<size_t>(code - 1)};
}

std::string PinTable::key_of(const Slot &s) const {
    char buf[inline_bytes];
    const KeyRef k = key_ref(s, buf);
    return std::string(k.data, k.len);
}

void PinTable::rehash(size_t capacity) {
    // Straight from the old slots, in slot order: each used slot is visited
    // once, its key hashed where it lies (an inline key copied to a 12-byte
    // buffer first); nothing is allocated per key.
    size_t long_bytes = 0;
    for (size_t i = 0; i < nslots_; i++)
        if ((slots_[i].w0 & 0xff) == code_long) long_bytes += static_cast<uint32_t>(slots_[i].w1);
    size_t i = 0;
    char buf[inline_bytes];
    // fill() asks for count_ pins, one after another, and uses each before
    // asking for the next (buf holds one inline key).
    fill(count_, capacity, long_bytes, false, [&] {
        for (;; i++) {
            const uint64_t code = slots_[i].w0 & 0xff;
            if (code != code_empty && code != code_removed) break;
        }
        const Slot &s = slots_[i++];
        const KeyRef key = key_ref(s, buf);
        return Entry{key, hash_bytes(key.data, key.len), node_of(s)};
    });
}

int32_t PinTable::upsert(uint64_t hash, const char *key, size_t len, int32_t node) {
    if (node < 0 || node > max_node) throw std::length_error("too many nodes named by pins");
    // At most 7/8 full (live and tombstones): a probe ends, and stays short.
    if (nslots_ == 0 || (count_ + tombstones_ + 1) * 8 > nslots_ * 7) {
        // Mostly live: twice the slots (a table sized for 3/2 of them at 3/4
        // full). Mostly tombstones: the live pins and this one, as a build.
        const size_t live = count_ + 1;
        rehash(live * 4 > nslots_ * 3 ? nslots_ * 3 / 2 : live);
    }
    const Probe q(hash, key, len);
    size_t i = home(hash);
    size_t reuse = SIZE_MAX;
    for (;;) {
        Slot &s = slots_[i];
        const uint64_t code = s.w0 & 0xff;
        if (code == code_empty) break;
        if (code == code_removed) {
            if (reuse == SIZE_MAX) reuse = i;
        } else if (q.holds(s, keys_.data(), key, len)) {
            const int32_t before = node_of(s);
            set_node(s, node);
            return before;
        }
        if (++i == nslots_) i = 0;
    }
    if (len > inline_bytes && keys_.size() + len > UINT32_MAX) throw std::length_error("too many pinned key bytes");
    Slot fresh{q.w0 | (static_cast<uint64_t>(node) << 8), q.w1};
    if (len > inline_bytes) {
        fresh.w0 |= static_cast<uint64_t>(keys_.size()) << 32;
        keys_.append(key, len);
    }
    if (reuse != SIZE_MAX) {
        i = reuse;
        tombstones_--;
    }
    slots_[i] = fresh;
    filter_[filter_word(hash, filter_words_)] |= filter_bits(hash);
    count_++;
    // The filter is sized with the table (10 bits per pin it was sized for,
    // at least 8.5 when 7/8 full); keep at least 4 bits per pin anyway.
    if (count_ * 4 > filter_words_ * 64) rehash(count_);
    return -1;
}

int32_t PinTable::erase(uint64_t hash, const char *key, size_t len) {
    if (count_ == 0) return -1;
    const Probe q(hash, key, len);
    size_t i = home(hash);
    for (;;) {
        Slot &s = slots_[i];
        if ((s.w0 & 0xff) == code_empty) return -1;
        if (q.holds(s, keys_.data(), key, len)) {
            const int32_t before = node_of(s);
            s.w0 = code_removed;
            s.w1 = 0;
            count_--;
            tombstones_++;
            return before;
        }
        if (++i == nslots_) i = 0;
    }
}

size_t PinTable::longest_probe() const {
    size_t longest = 0;
    for (size_t i = 0; i < nslots_; i++) {
        const uint64_t code = slots_[i].w0 & 0xff;
        if (code == code_empty || code == code_removed) continue;
        const std::string key = key_of(slots_[i]);
        const size_t start = home(hash_bytes(key.data(), key.size()));
        longest = std::max(longest, (i + nslots_ - start) % nslots_ + 1);
    }
    return longest;
}

int32_t MapRoutes::find_or_add_node(const char *node, size_t len, bool *added) {
    *added = false;
    for (size_t n = 0; n < nodes.size(); n++)
        if (nodes[n].size() == len && std::memcmp(nodes[n].data(), node, len) == 0) return static_cast<int32_t>(n);
    nodes.emplace_back(node, len);
    *added = true;
    return static_cast<int32_t>(nodes.size() - 1);
}

void MapRoutes::compute_partitions() {
    node_partition.assign(nodes.size(), -1);
    for (int32_t l = 0; l < logical_shards; l++) {
        int32_t &p = node_partition[static_cast<size_t>(owner[static_cast<size_t>(l)])];
        if (p < 0) p = l;
    }
    std::vector<int32_t> pin_only;
    node_pins.resize(nodes.size(), 0);
    for (size_t n = 0; n < nodes.size(); n++)
        if (node_partition[n] < 0 && node_pins[n] > 0) pin_only.push_back(static_cast<int32_t>(n));
    // std::string compares like memcmp, then by length: PostgreSQL's "C" order.
    std::sort(pin_only.begin(), pin_only.end(),
              [this](int32_t a, int32_t b) { return nodes[static_cast<size_t>(a)] < nodes[static_cast<size_t>(b)]; });
    for (size_t i = 0; i < pin_only.size(); i++)
        node_partition[static_cast<size_t>(pin_only[i])] = logical_shards + static_cast<int32_t>(i);
}

int32_t MapRoutes::node_index(const char *node, size_t len) {
    // Pins may name many dedicated nodes, so intern through a hash.
    auto ins = node_ids_.emplace(std::string(node, len), static_cast<int32_t>(nodes.size()));
    if (ins.second) nodes.emplace_back(node, len);
    return ins.first->second;
}

}  // namespace sharding
