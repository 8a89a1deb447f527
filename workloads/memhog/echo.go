package main

import (
	"bufio"
	"net"
)

// serveEcho answers each line on each TCP connection with the same line:
// a client that numbers its lines sees at once whether a connection lost,
// repeated or reordered anything across a migration.
func serveEcho(l net.Listener) error {
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			sc := bufio.NewScanner(c)
			w := bufio.NewWriter(c)
			for sc.Scan() {
				w.Write(sc.Bytes())
				w.WriteByte('\n')
				if w.Flush() != nil {
					return
				}
			}
		}()
	}
}
