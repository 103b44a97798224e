// WireWriter / WireReader: the fixed binary schema of control messages (little-endian integers,
// length-prefixed strings and vectors). Control messages are never pickled or evaluated; a reader
// that runs past the end or meets an impossible length reports an error instead of crashing.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace horo {

class WireWriter {
 public:
  void U8(uint8_t v) { Raw(&v, 1); }
  void I32(int32_t v) { Raw(&v, 4); }
  void I64(int64_t v) { Raw(&v, 8); }
  void F64(double v) { Raw(&v, 8); }
  void Str(const std::string& s) {
    I64(static_cast<int64_t>(s.size()));
    Raw(s.data(), s.size());
  }
  void I64Vec(const std::vector<int64_t>& v) {
    I64(static_cast<int64_t>(v.size()));
    Raw(v.data(), v.size() * 8);
  }
  void I32Vec(const std::vector<int32_t>& v) {
    I64(static_cast<int64_t>(v.size()));
    Raw(v.data(), v.size() * 4);
  }
  // Room for bytes more without growing: one allocation for a message whose size is known.
  void Reserve(size_t bytes) { out_.reserve(out_.size() + bytes); }
  const std::string& data() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

class WireReader {
 public:
  explicit WireReader(const std::string& in) : in_(in) {}
  bool ok() const { return ok_; }
  bool AtEnd() const { return pos_ == in_.size(); }
  uint8_t U8() { uint8_t v = 0; Raw(&v, 1); return v; }
  int32_t I32() { int32_t v = 0; Raw(&v, 4); return v; }
  int64_t I64() { int64_t v = 0; Raw(&v, 8); return v; }
  double F64() { double v = 0; Raw(&v, 8); return v; }
  std::string Str() {
    int64_t n = Length(1);
    std::string s(in_.data() + pos_, ok_ ? n : 0);
    pos_ += ok_ ? n : 0;
    return s;
  }
  std::vector<int64_t> I64Vec() {
    int64_t n = Length(8);
    std::vector<int64_t> v(ok_ ? n : 0);
    Raw(v.data(), v.size() * 8);
    return v;
  }
  std::vector<int32_t> I32Vec() {
    int64_t n = Length(4);
    std::vector<int32_t> v(ok_ ? n : 0);
    Raw(v.data(), v.size() * 4);
    return v;
  }
  // The same into existing objects, reusing their storage.
  void StrInto(std::string* s) {
    int64_t n = Length(1);
    s->assign(in_.data() + pos_, ok_ ? n : 0);
    pos_ += ok_ ? n : 0;
  }
  void I64VecInto(std::vector<int64_t>* v) {
    int64_t n = Length(8);
    v->resize(ok_ ? n : 0);
    Raw(v->data(), v->size() * 8);
  }
  void I32VecInto(std::vector<int32_t>* v) {
    int64_t n = Length(4);
    v->resize(ok_ ? n : 0);
    Raw(v->data(), v->size() * 4);
  }

 private:
  // Reads an element count and checks that count * element_size bytes remain.
  int64_t Length(int64_t element_size) {
    int64_t n = I64();
    if (!ok_ || n < 0 || static_cast<uint64_t>(n) > (in_.size() - pos_) / element_size) {
      ok_ = false;
      return 0;
    }
    return n;
  }
  void Raw(void* p, size_t n) {
    if (!ok_ || in_.size() - pos_ < n) {
      ok_ = false;
      return;
    }
    if (n) std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
  }
  const std::string& in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace horo
