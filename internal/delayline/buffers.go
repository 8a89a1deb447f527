package delayline

// Frames are copied out of the receive buffer into one of a few sizes, so
// that a queue of small frames (a bulk transfer's ACKs) does not pin a
// 64 KiB buffer each; each direction recycles its own, since its receiver
// fills them and its sender frees them.

// bufSizes are the buffer sizes; the last holds a whole GSO frame of
// 64 KiB with its headers. Larger frames (BIG TCP) get one of their own.
var bufSizes = [...]int{256, 2048, 16 << 10, 64<<10 + 1024}

// freeListLen bounds each size's recycled buffers.
const freeListLen = 512

type buffers struct {
	free [len(bufSizes)]chan []byte
}

func newBuffers() *buffers {
	var b buffers
	for i := range b.free {
		b.free[i] = make(chan []byte, freeListLen)
	}
	return &b
}

// get is a buffer of length n.
func (b *buffers) get(n int) []byte {
	for i, size := range bufSizes {
		if n > size {
			continue
		}
		select {
		case buf := <-b.free[i]:
			return buf[:n]
		default:
			return make([]byte, n, size)
		}
	}
	return make([]byte, n)
}

// put recycles a buffer get gave.
func (b *buffers) put(buf []byte) {
	for i, size := range bufSizes {
		if cap(buf) == size {
			select {
			case b.free[i] <- buf:
			default:
			}
			return
		}
	}
}
