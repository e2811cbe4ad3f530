// ODR check: links odr_a.cpp and odr_b.cpp into one program and checks both still work.
// Exit code 0 on success, 1 on a wrong value (the link itself is the main check).
#include <selfattn/selfattn.hpp>

#include <cstdio>
#include <utility>

std::pair<selfattn::Index, float> odr_a();
std::pair<selfattn::Index, float> odr_b();

int main() {
  const auto a = odr_a();
  const auto b = odr_b();
  const bool ok = a.first == 24 && a.second == 1.5f && b.first == 15 && b.second == -2.0f;
  std::printf("odr_a: size %td value %g; odr_b: size %td value %g: %s\n", a.first,
              static_cast<double>(a.second), b.first, static_cast<double>(b.second),
              ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
