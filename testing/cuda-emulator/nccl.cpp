// NCCL's all-reduce among processes of one host, on the emulated devices.
//
// ncclGetUniqueId opens a loopback listener in the calling process (rank 0 of what follows) and
// writes its port and a random token into the id; ncclCommInitRank connects every other rank to
// it (a star: rank 0 sums in rank order and sends the result back). ncclAllReduce is queued on the
// current context like a kernel and runs when the process waits for its stream, so the ranks meet
// inside their waits, as NCCL kernels meet on the GPUs. Every socket has a 60 s deadline: a rank
// that never arrives fails the operation instead of hanging it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "emulator.h"

#define API extern "C" __attribute__((visibility("default")))

enum ncclResult_t : int {
    ncclSuccess = 0,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
};

struct ncclUniqueId {
    char internal[128];
};

struct Comm {
    int rank = 0, nranks = 0;
    std::vector<int> peers;  // rank 0: a socket per rank (index 0 unused); others: [0] to rank 0
};
using ncclComm_t = Comm*;

namespace {

constexpr char MAGIC[8] = {'r', 'f', 'e', 'm', 'u', 'n', 'c', 'l'};

struct IdLayout {
    char magic[8];
    uint16_t port;
    uint64_t token;
    int listener;  // valid in the process that made the id
};
static_assert(sizeof(IdLayout) <= sizeof(ncclUniqueId), "the id holds the rendezvous");

using emu::refuse;

void with_deadline(int fd) {
    timeval tv{60, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

bool send_all(int fd, const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

bool recv_all(int fd, void* data, size_t n) {
    char* p = static_cast<char*>(data);
    while (n > 0) {
        ssize_t k = recv(fd, p, n, 0);
        if (k <= 0) return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

// One averaging all-reduce of `count` floats; returns "" or what failed.
std::string all_reduce(Comm* c, const float* send, float* recv, size_t count) {
    std::vector<float> buf(send, send + count);
    size_t bytes = count * sizeof(float);
    if (c->rank == 0) {
        std::vector<float> part(count);
        for (int r = 1; r < c->nranks; ++r) {
            if (!recv_all(c->peers[r], part.data(), bytes))
                return "rank " + std::to_string(r) + " did not send its part";
            for (size_t i = 0; i < count; ++i) buf[i] += part[i];
        }
        for (float& v : buf) v /= (float)c->nranks;
        for (int r = 1; r < c->nranks; ++r) {
            if (!send_all(c->peers[r], buf.data(), bytes))
                return "rank " + std::to_string(r) + " did not take the result";
        }
    } else {
        if (!send_all(c->peers[0], buf.data(), bytes) || !recv_all(c->peers[0], buf.data(), bytes))
            return "rank 0 did not answer";
    }
    std::memcpy(recv, buf.data(), bytes);
    return "";
}

}  // namespace

API ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd < 0 || bind(fd, (sockaddr*)&addr, sizeof addr) != 0 || listen(fd, 64) != 0 ||
        getsockname(fd, (sockaddr*)&addr, &len) != 0)
        return refuse("ncclGetUniqueId", ncclSystemError, std::strerror(errno));
    IdLayout layout{};
    std::memcpy(layout.magic, MAGIC, sizeof MAGIC);
    layout.port = ntohs(addr.sin_port);
    layout.token = std::random_device{}() * 0x100000001ull ^ std::random_device{}();
    layout.listener = fd;
    std::memset(id, 0, sizeof *id);
    std::memcpy(id->internal, &layout, sizeof layout);
    return ncclSuccess;
}

API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    const char* call = "ncclCommInitRank";
    IdLayout layout;
    std::memcpy(&layout, id.internal, sizeof layout);
    if (std::memcmp(layout.magic, MAGIC, sizeof MAGIC) != 0)
        return refuse(call, ncclInvalidArgument, "not an id from ncclGetUniqueId");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return refuse(call, ncclInvalidArgument, "rank outside 0..nranks");
    if (!emu::has_current_context())
        return refuse(call, ncclInvalidUsage, "no current CUDA context");
    auto* c = new Comm;
    c->rank = rank;
    c->nranks = nranks;
    if (rank == 0) {
        with_deadline(layout.listener);
        c->peers.assign((size_t)nranks, -1);
        for (int joined = 1; joined < nranks; ++joined) {
            int fd = accept(layout.listener, nullptr, nullptr);
            if (fd < 0) return refuse(call, ncclRemoteError, "a rank did not connect in 60 s");
            with_deadline(fd);
            uint64_t token = 0;
            int32_t peer = -1;
            if (!recv_all(fd, &token, sizeof token) || !recv_all(fd, &peer, sizeof peer) ||
                token != layout.token || peer < 1 || peer >= nranks || c->peers[peer] != -1)
                return refuse(call, ncclRemoteError, "a connection did not present this id");
            c->peers[peer] = fd;
        }
        close(layout.listener);
    } else {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        addr.sin_port = htons(layout.port);
        with_deadline(fd);
        int32_t me = rank;
        if (connect(fd, (sockaddr*)&addr, sizeof addr) != 0 ||
            !send_all(fd, &layout.token, sizeof layout.token) || !send_all(fd, &me, sizeof me))
            return refuse(call, ncclRemoteError, "cannot reach rank 0");
        c->peers.push_back(fd);
    }
    *comm = c;
    return ncclSuccess;
}

API ncclResult_t ncclGroupStart() { return ncclSuccess; }
API ncclResult_t ncclGroupEnd() { return ncclSuccess; }

API ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, int datatype, int op,
                               ncclComm_t comm, void* stream) {
    const char* call = "ncclAllReduce";
    (void)stream;
    if (datatype != 7 || op != 4)
        return refuse(call, ncclInvalidArgument, "only float32 averages are emulated");
    if (!emu::is_device_range((uintptr_t)send, count * 4) ||
        !emu::is_device_range((uintptr_t)recv, count * 4))
        return refuse(call, ncclInvalidArgument, "a buffer is not device memory");
    bool queued = emu::enqueue([=]() -> std::string {
        return all_reduce(comm, (const float*)send, (float*)recv, count);
    });
    return queued ? ncclSuccess : refuse(call, ncclInvalidUsage, "no current CUDA context");
}

API ncclResult_t ncclCommAbort(ncclComm_t comm) {
    for (int fd : comm->peers)
        if (fd >= 0) close(fd);
    delete comm;
    return ncclSuccess;
}
