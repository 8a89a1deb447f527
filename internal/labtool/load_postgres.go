package labtool

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	// fillRowSize is a fill row's payload: with its id and tuple header,
	// about 1 KiB a row (uncompressed: under TOAST's threshold).
	fillRowSize  = 1000
	fillRowBytes = 1024
	// loadRowSize is the payload of a row a load client inserts.
	loadRowSize = 256
)

const postgresAppName = "ferry lab-tool load"

// postgresConfig reads addr: a URL (postgres://user:pass@host:port/db?
// sslmode=disable) or key=value settings (host=... port=... user=...
// dbname=...) as libpq takes them, or a bare host:port, which means user
// postgres, database postgres, no TLS.
func postgresConfig(addr string) (*pgx.ConnConfig, error) {
	if !strings.Contains(addr, "://") && !strings.Contains(addr, "=") {
		addr = "postgres://postgres@" + addr + "/postgres?sslmode=disable"
	}
	cfg, err := pgx.ParseConfig(addr)
	if err != nil {
		return nil, err
	}
	cfg.ConnectTimeout = 5 * time.Second
	if cfg.RuntimeParams["application_name"] == "" {
		// So that pg_stat_activity tells the load's connections apart.
		cfg.RuntimeParams["application_name"] = postgresAppName
	}
	return cfg, nil
}

// pgLane is one kept connection and the rows it had acknowledged.
type pgLane struct {
	conn  *pgx.Conn
	acked []int64
	// inDoubt are inserts that failed: committed or not, the check looks.
	inDoubt []int64
}

// postgresLoad inserts one row per transaction on every connection into
// ferry_load (run, lane, seq, payload); the check compares the run's row
// count and a checksum the server computes with what was acknowledged.
type postgresLoad struct {
	cfg     *pgx.ConnConfig
	runName string
	rec     *recorder
	lanes   []pgLane
}

const loadTableSQL = `CREATE TABLE IF NOT EXISTS ferry_load (
	run text NOT NULL, lane int NOT NULL, seq bigint NOT NULL, payload text NOT NULL,
	PRIMARY KEY (run, lane, seq))`

func rowKey(run string, lane int, seq int64) string {
	return fmt.Sprintf("row:%s:%d:%d", run, lane, seq)
}

func connectPostgres(ctx context.Context, o LoadOptions, rec *recorder) (workload, error) {
	cfg, err := postgresConfig(o.Addr)
	if err != nil {
		return nil, err
	}
	w := &postgresLoad{cfg: cfg, runName: o.Run, rec: rec, lanes: make([]pgLane, o.Conns)}
	for i := range w.lanes {
		if w.lanes[i].conn, err = pgx.ConnectConfig(ctx, cfg); err != nil {
			w.close()
			return nil, err
		}
	}
	if _, err := w.lanes[0].conn.Exec(ctx, loadTableSQL); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

func (w *postgresLoad) run(ctx context.Context, rate float64, stop <-chan struct{}) {
	tickRequests(ctx, w.rec, len(w.lanes), rate, stop, w.request)
}

func (w *postgresLoad) request(ctx context.Context, lane, i int) error {
	l := &w.lanes[lane]
	if l.conn.IsClosed() {
		c, err := pgx.ConnectConfig(ctx, w.cfg)
		if err != nil {
			return err
		}
		l.conn = c
		w.rec.reconnected()
	}
	seq := int64(i)
	_, err := l.conn.Exec(ctx, `INSERT INTO ferry_load (run, lane, seq, payload) VALUES ($1, $2, $3, $4)`,
		w.runName, lane, seq, string(value(rowKey(w.runName, lane, seq), loadRowSize)))
	if err != nil {
		l.inDoubt = append(l.inDoubt, seq)
		return err
	}
	l.acked = append(l.acked, seq)
	return nil
}

func (w *postgresLoad) check(ctx context.Context) (bool, string, error) {
	c, err := pgx.ConnectConfig(ctx, w.cfg)
	if err != nil {
		return false, "", err
	}
	defer c.Close(context.WithoutCancel(ctx))

	// What must be there: every acknowledged row, and the failed inserts
	// that committed anyway (a connection lost before the answer).
	want := map[string]int64{}
	acked, found := 0, 0
	for lane, l := range w.lanes {
		for _, seq := range l.acked {
			want[fmt.Sprint(lane, seq)] = rowHash(value(rowKey(w.runName, lane, seq), loadRowSize))
		}
		acked += len(l.acked)
		if len(l.inDoubt) == 0 {
			continue
		}
		rows, err := c.Query(ctx, `SELECT seq FROM ferry_load WHERE run = $1 AND lane = $2 AND seq = ANY($3)`, w.runName, lane, l.inDoubt)
		if err != nil {
			return false, "", err
		}
		seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return false, "", err
		}
		for _, seq := range seqs {
			want[fmt.Sprint(lane, seq)] = rowHash(value(rowKey(w.runName, lane, seq), loadRowSize))
		}
		found += len(seqs)
	}
	var wantSum int64
	for _, h := range want {
		wantSum += h
	}
	var n, sum int64
	if err := c.QueryRow(ctx, `SELECT count(*), coalesce(sum(`+rowHashSQL+`), 0)::bigint FROM ferry_load WHERE run = $1`, w.runName).Scan(&n, &sum); err != nil {
		return false, "", err
	}
	loadOK := n == int64(len(want)) && sum == wantSum
	state := fmt.Sprintf("rows: %d acknowledged + %d of %d failed inserts committed anyway; the server has %d, checksum %s",
		acked, found, countInDoubt(w.lanes), n, map[bool]string{true: "equal", false: "differs"}[sum == wantSum])
	if !loadOK {
		missing, wrong, extra, err := pgCompareRows(ctx, c, `SELECT lane || ' ' || seq, `+rowHashSQL+` FROM ferry_load WHERE run = $1`, want, w.runName)
		if err != nil {
			return false, "", err
		}
		state += fmt.Sprintf(" (%d missing, %d wrong, %d not acknowledged)", missing, wrong, extra)
	}
	fr, err := checkFillPostgresWith(ctx, c)
	if err != nil {
		return false, "", err
	}
	return loadOK && fr.ok(), state + "; " + fr.String(), nil
}

func countInDoubt(lanes []pgLane) int {
	n := 0
	for _, l := range lanes {
		n += len(l.inDoubt)
	}
	return n
}

func (w *postgresLoad) close() {
	for _, l := range w.lanes {
		if l.conn != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = l.conn.Close(ctx)
			cancel()
		}
	}
}

// pgCompareRows reads (key, hash) rows of query and compares them with
// want: rows absent, rows with another hash, rows not wanted.
func pgCompareRows(ctx context.Context, c *pgx.Conn, query string, want map[string]int64, args ...any) (missing, wrong, extra int, err error) {
	rows, err := c.Query(ctx, query, args...)
	if err != nil {
		return 0, 0, 0, err
	}
	seen := map[string]bool{}
	var key string
	var h int64
	_, err = pgx.ForEachRow(rows, []any{&key, &h}, func() error {
		w, ok := want[key]
		switch {
		case !ok:
			extra++
		case w != h:
			wrong++
		}
		seen[key] = true
		return nil
	})
	if err != nil {
		return 0, 0, 0, err
	}
	for k := range want {
		if !seen[k] {
			missing++
		}
	}
	return missing, wrong, extra, nil
}

func fillRowKey(id int64) string { return fmt.Sprintf("fill:%d", id) }

func fillPostgres(ctx context.Context, addr string, bytes int64) error {
	cfg, err := postgresConfig(addr)
	if err != nil {
		return err
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	for _, q := range []string{
		`DROP TABLE IF EXISTS ferry_fill, ferry_fill_meta`,
		`CREATE TABLE ferry_fill (id bigint PRIMARY KEY, payload text NOT NULL)`,
		`CREATE TABLE ferry_fill_meta (rows bigint NOT NULL, size int NOT NULL)`,
	} {
		if _, err := c.Exec(ctx, q); err != nil {
			return err
		}
	}
	n := int64(fillCount(bytes, fillRowBytes))
	const batch = 10000
	for start := int64(0); start < n; start += batch {
		end := min(start+batch, n)
		src := pgx.CopyFromSlice(int(end-start), func(i int) ([]any, error) {
			id := start + int64(i)
			return []any{id, string(value(fillRowKey(id), fillRowSize))}, nil
		})
		if _, err := c.CopyFrom(ctx, pgx.Identifier{"ferry_fill"}, []string{"id", "payload"}, src); err != nil {
			return err
		}
	}
	_, err = c.Exec(ctx, `INSERT INTO ferry_fill_meta VALUES ($1, $2)`, n, fillRowSize)
	return err
}

func checkFillPostgres(ctx context.Context, addr string) (fillReport, error) {
	cfg, err := postgresConfig(addr)
	if err != nil {
		return fillReport{}, err
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fillReport{}, err
	}
	defer c.Close(context.WithoutCancel(ctx))
	return checkFillPostgresWith(ctx, c)
}

func checkFillPostgresWith(ctx context.Context, c *pgx.Conn) (fillReport, error) {
	var items int64
	var size int
	err := c.QueryRow(ctx, `SELECT rows, size FROM ferry_fill_meta`).Scan(&items, &size)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table
		return fillReport{}, nil
	case err != nil:
		return fillReport{}, err
	}
	r := fillReport{Items: int(items), Size: size}
	var wantSum int64
	for id := range items {
		wantSum += rowHash(value(fillRowKey(id), size))
	}
	var n, sum int64
	if err := c.QueryRow(ctx, `SELECT count(*), coalesce(sum(`+rowHashSQL+`), 0)::bigint FROM ferry_fill`).Scan(&n, &sum); err != nil {
		return r, err
	}
	if n == items && sum == wantSum {
		return r, nil
	}
	// Something differs: find which rows, one by one.
	want := make(map[string]int64, items)
	for id := range items {
		want[fmt.Sprint(id)] = rowHash(value(fillRowKey(id), size))
	}
	missing, wrong, extra, err := pgCompareRows(ctx, c, `SELECT id::text, `+rowHashSQL+` FROM ferry_fill`, want)
	r.Missing, r.Wrong = missing, wrong+extra
	return r, err
}
