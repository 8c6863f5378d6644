#pragma once
// Every exception ddp throws derives from ddp::Error. what() is one line that names the cause
// and, where one is known, the fix. The launcher maps the subclasses to its exit codes.
#include <stdexcept>
#include <string>
#include <utility>

namespace ddp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A wrong or missing setting: environment variable, flag, option value.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// The rendezvous store could not be reached or did not answer in time.
class StoreError : public Error {
 public:
  using Error::Error;
};

// The store could not be reached within the time given (nothing answered, or not yet). cause()
// is the last attempt's reason alone ("connection refused"), for a caller that retries itself
// and words its own message.
class StoreUnreachableError : public StoreError {
 public:
  StoreUnreachableError(const std::string& message, std::string cause)
      : StoreError(message), cause_(std::move(cause)) {}
  const std::string& cause() const { return cause_; }

 private:
  std::string cause_;
};

// The rendezvous store refused this agent: it lacks the job's join token, or has a wrong one.
class JoinRefusedError : public StoreError {
 public:
  using StoreError::StoreError;
};

// A collective failed. Carries the op, this rank and, when known, the peer involved (-1 if not).
class CommError : public Error {
 public:
  CommError(std::string op, int rank, int peer, const std::string& cause);
  const std::string& op() const { return op_; }
  int rank() const { return rank_; }
  int peer() const { return peer_; }

 private:
  std::string op_;
  int rank_;
  int peer_;
};

// A collective did not complete within the communicator's timeout.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

// A data file is missing, truncated or not in the expected format.
class DataError : public Error {
 public:
  DataError(std::string file, const std::string& cause);
  const std::string& file() const { return file_; }

 private:
  std::string file_;
};

}  // namespace ddp
