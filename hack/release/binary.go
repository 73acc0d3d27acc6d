package main

import (
	"debug/elf"
	"debug/macho"
	"encoding/binary"
	"fmt"
)

// headerSize is enough of an executable to tell its format and machine.
const headerSize = 64

// binaryPlatform reads the platform an executable was built for from its first bytes: a 64-bit
// little-endian ELF file is linux (e_machine says the architecture), a 64-bit Mach-O file
// darwin (cputype says it). Anything else is an error.
func binaryPlatform(head []byte) (platform, error) {
	switch {
	case len(head) >= 20 && string(head[:4]) == elf.ELFMAG:
		if elf.Class(head[elf.EI_CLASS]) != elf.ELFCLASS64 || elf.Data(head[elf.EI_DATA]) != elf.ELFDATA2LSB {
			return platform{}, fmt.Errorf("an ELF file of class %v, %v: want 64-bit little-endian", elf.Class(head[elf.EI_CLASS]), elf.Data(head[elf.EI_DATA]))
		}
		switch m := elf.Machine(binary.LittleEndian.Uint16(head[18:20])); m {
		case elf.EM_X86_64:
			return platform{"linux", "amd64"}, nil
		case elf.EM_AARCH64:
			return platform{"linux", "arm64"}, nil
		default:
			return platform{}, fmt.Errorf("an ELF file for machine %v", m)
		}
	case len(head) >= 8 && binary.LittleEndian.Uint32(head) == macho.Magic64:
		switch c := macho.Cpu(binary.LittleEndian.Uint32(head[4:8])); c {
		case macho.CpuAmd64:
			return platform{"darwin", "amd64"}, nil
		case macho.CpuArm64:
			return platform{"darwin", "arm64"}, nil
		default:
			return platform{}, fmt.Errorf("a Mach-O file for cpu %v", c)
		}
	}
	return platform{}, fmt.Errorf("not a 64-bit ELF or Mach-O executable (starts %q)", head[:min(len(head), 8)])
}
