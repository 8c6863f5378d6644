#ifndef DDP_CAPI_H
#define DDP_CAPI_H
/* A small C ABI over the library's communicators, for bindings that must not depend on torch's
 * C++ ABI: python/ddprun_torch loads libddp_capi with ctypes into any PyTorch 2.x process.
 *
 * Only raw pointers, element counts and integer codes cross it. No exception crosses it: a call
 * that fails returns NULL (or nonzero) and writes one line naming the operation, the rank and the
 * cause into the caller's `err` buffer (truncated to err_len - 1 bytes, always terminated).
 *
 * Collectives are asynchronous. Each returns a ddp_work that the caller waits on and frees; they
 * run in the order they are issued, one at a time, on the communicator's own thread, so the
 * buffers must stay valid until the wait returns. The version below changes whenever a
 * signature or a code does; a binding checks ddp_capi_version() before any other call. */
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_CAPI_VERSION 1

/* Element types, in ddp::DataType's order. */
enum ddp_dtype {
  DDP_DTYPE_FLOAT32 = 0,
  DDP_DTYPE_FLOAT64 = 1,
  DDP_DTYPE_BFLOAT16 = 2,
  DDP_DTYPE_FLOAT16 = 3,
  DDP_DTYPE_INT32 = 4,
  DDP_DTYPE_INT64 = 5
};
/* Reductions, in ddp::ReduceOp's order. */
enum ddp_reduce_op { DDP_OP_SUM = 0, DDP_OP_AVG = 1, DDP_OP_MIN = 2, DDP_OP_MAX = 3 };

/* The caller's rendezvous store (torch's own c10d Store, for the Python binding), called for
 * each store operation the communicator makes while it connects. `args` holds `nargs` byte
 * strings: the operation's keys and values, as listed below. The callback answers by calling
 * ddp_store_reply once per returned string, in order, and returns 0; or it returns nonzero
 * after one ddp_store_reply with its error message.
 *   SET key value           ->
 *   GET key                 -> value   (waits up to the store's timeout for the key)
 *   ADD key                 -> the new value in decimal; `number` is the delta
 *   COMPARE_SET key expected desired -> the value after the operation
 *   CHECK key...            -> "1" when every key exists, else "0"
 *   WAIT key...             ->         (`number` is the timeout in ms)
 *   DELETE key              -> "1" when the key existed, else "0"
 *   APPEND key value        ->
 *   MULTI_GET key...        -> one value per key
 *   MULTI_SET key value ... ->
 *   NUM_KEYS                -> the count in decimal */
enum ddp_store_op {
  DDP_STORE_SET = 0,
  DDP_STORE_GET = 1,
  DDP_STORE_ADD = 2,
  DDP_STORE_COMPARE_SET = 3,
  DDP_STORE_CHECK = 4,
  DDP_STORE_WAIT = 5,
  DDP_STORE_DELETE = 6,
  DDP_STORE_APPEND = 7,
  DDP_STORE_MULTI_GET = 8,
  DDP_STORE_MULTI_SET = 9,
  DDP_STORE_NUM_KEYS = 10
};
typedef int (*ddp_store_fn)(void* ctx, int op, const char* const* args, const size_t* lens,
                            size_t nargs, int64_t number, void* reply);
void ddp_store_reply(void* reply, const char* data, size_t len);

typedef struct ddp_comm ddp_comm;
typedef struct ddp_work ddp_work;

int ddp_capi_version(void);

/* Connects `size` ranks through the caller's store. `backend` is "gloo" or "fabric" (NULL or ""
 * reads DDP_BACKEND); `store_host` is the host that serves the store, from which each rank picks
 * the address it listens on (DDP_SOCKET_IFNAME wins). Every other setting comes from the DDP_*
 * environment, as for a C++ worker. */
ddp_comm* ddp_comm_create(const char* backend, ddp_store_fn store, void* store_ctx,
                          const char* store_host, int rank, int size, int64_t timeout_ms, char* err,
                          size_t err_len);
void ddp_comm_destroy(ddp_comm* comm);
/* "gloo" or "fabric"; 1 when allreduce, broadcast and barrier run in two levels. */
const char* ddp_comm_backend(const ddp_comm* comm);
int ddp_comm_hierarchical(const ddp_comm* comm);

/* In place over `count` elements. */
ddp_work* ddp_allreduce(ddp_comm* comm, void* data, size_t count, int dtype, int op, char* err,
                        size_t err_len);
ddp_work* ddp_broadcast(ddp_comm* comm, void* data, size_t count, int dtype, int root, char* err,
                        size_t err_len);
/* `output` holds size * count elements; rank r's input lands at output + r * count. */
ddp_work* ddp_allgather(ddp_comm* comm, const void* input, void* output, size_t count, int dtype,
                        char* err, size_t err_len);
/* `input` holds size * count elements; rank r gets the reduction of block r in `output`. */
ddp_work* ddp_reduce_scatter(ddp_comm* comm, const void* input, void* output, size_t count,
                             int dtype, int op, char* err, size_t err_len);
ddp_work* ddp_barrier(ddp_comm* comm, char* err, size_t err_len);

/* Blocks until the operation finished: 0, or nonzero with its error in `err`. */
int ddp_work_wait(ddp_work* work, char* err, size_t err_len);
/* 1 once the operation finished (successfully or not); never blocks. */
int ddp_work_completed(const ddp_work* work);
void ddp_work_free(ddp_work* work);

#ifdef __cplusplus
}
#endif

#endif
