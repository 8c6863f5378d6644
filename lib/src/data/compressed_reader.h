#pragma once
// Sequential reads from a file that may be gzip-compressed (zlib detects it from the content and
// passes plain files through). Errors are DataErrors naming the file.
#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp::data::detail {

class CompressedReader {
 public:
  // Throws DataError if the file cannot be opened (missing, unreadable, a directory).
  explicit CompressedReader(std::string path);
  ~CompressedReader();
  CompressedReader(const CompressedReader&) = delete;
  CompressedReader& operator=(const CompressedReader&) = delete;

  // Reads up to n bytes; returns fewer only at the end of the data. Throws DataError for corrupt
  // or truncated gzip data.
  std::size_t read(void* dst, std::size_t n);
  // Total decompressed bytes read so far.
  uint64_t position() const { return position_; }
  bool compressed() const { return compressed_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* file_ = nullptr;  // gzFile
  uint64_t position_ = 0;
  bool compressed_ = false;
};

}  // namespace ddp::data::detail
