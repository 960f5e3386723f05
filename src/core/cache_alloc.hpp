// Allocation of cached C++ containers: pure C++, no PostgreSQL header.
//
// Containers that live in a per-backend cache (route_cache.hpp's MapRoutes,
// the rank lists) use CacheAllocator, so their memory is counted in the
// "sharding cache" memory context (src/pg/cache.hpp) that
// pg_backend_memory_contexts shows. The extension installs the context's
// allocator into cache_alloc_hooks when it is loaded (src/pg/cache.cpp); code
// built without it (the unit tests) falls back to operator new.
#pragma once

#include <cstddef>
#include <new>
#include <string>
#include <vector>

namespace sharding {

struct CacheAllocHooks {
    void *(*allocate)(std::size_t bytes) = nullptr;  // nullptr on failure
    void (*deallocate)(void *p) = nullptr;
};
inline CacheAllocHooks cache_alloc_hooks;

template <class T>
struct CacheAllocator {
    using value_type = T;
    CacheAllocator() noexcept = default;
    template <class U>
    CacheAllocator(const CacheAllocator<U> &) noexcept {}
    T *allocate(std::size_t n) {
        if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_alloc();
        void *p = cache_alloc_hooks.allocate ? cache_alloc_hooks.allocate(n * sizeof(T))
                                             : ::operator new(n * sizeof(T), std::nothrow);
        if (p == nullptr) throw std::bad_alloc();
        return static_cast<T *>(p);
    }
    void deallocate(T *p, std::size_t) noexcept {
        if (cache_alloc_hooks.deallocate)
            cache_alloc_hooks.deallocate(p);
        else
            ::operator delete(p);
    }
};
template <class T, class U>
bool operator==(const CacheAllocator<T> &, const CacheAllocator<U> &) {
    return true;
}
template <class T, class U>
bool operator!=(const CacheAllocator<T> &, const CacheAllocator<U> &) {
    return false;
}

template <class T>
using CacheVector = std::vector<T, CacheAllocator<T>>;
using CacheString = std::basic_string<char, std::char_traits<char>, CacheAllocator<char>>;

// Constructs a T in cache memory / destroys and frees it.
template <class T, class... Args>
T *cache_new(Args &&...args) {
    CacheAllocator<T> a;
    T *p = a.allocate(1);
    try {
        return new (p) T(static_cast<Args &&>(args)...);
    } catch (...) {
        a.deallocate(p, 1);
        throw;
    }
}
template <class T>
void cache_delete(T *p) noexcept {
    if (p == nullptr) return;
    p->~T();
    CacheAllocator<T>().deallocate(p, 1);
}

}  // namespace sharding
