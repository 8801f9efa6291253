"""What ldd could not satisfy, said in a person's words."""

from __future__ import annotations

from llmgw.agent.provision.ldd import unmet


def test_a_missing_library_is_said_to_be_not_installed() -> None:
    out = (
        "\tlinux-vdso.so.1 (0x00007ffc)\n\tlibgomp.so.1 => not found\n\tlibc.so.6 => /lib/libc.so.6 (0x7f)\n"
    )

    assert unmet(out) == ["libgomp.so.1 is not installed"]


def test_a_library_too_old_for_the_build_is_said_to_be_too_old_with_what_it_needs() -> None:
    out = "\t/lib64/libstdc++.so.6: version `GLIBCXX_3.4.30' not found (required by /x/llama-server)\n"

    assert unmet(out) == ["libstdc++.so.6 is too old (needs GLIBCXX_3.4.30)"]


def test_each_shortfall_is_listed_once_in_the_order_ldd_gives() -> None:
    out = (
        "\t/lib64/libstdc++.so.6: version `GLIBCXX_3.4.30' not found (required by /x/libllama.so)\n"
        "\t/lib64/libstdc++.so.6: version `GLIBCXX_3.4.30' not found (required by /x/llama-server)\n"
        "\t/lib64/libstdc++.so.6: version `CXXABI_1.3.13' not found (required by /x/llama-server)\n"
        "\tlibcuda.so.1 => not found\n"
        "\tlibcuda.so.1 => not found\n"
    )

    assert unmet(out) == [
        "libstdc++.so.6 is too old (needs GLIBCXX_3.4.30)",
        "libstdc++.so.6 is too old (needs CXXABI_1.3.13)",
        "libcuda.so.1 is not installed",
    ]


def test_a_binary_that_loads_or_is_not_dynamic_has_nothing_unmet() -> None:
    assert unmet("\tlibc.so.6 => /lib/libc.so.6 (0x7f)\n") == []
    assert unmet("\tnot a dynamic executable\n") == []
